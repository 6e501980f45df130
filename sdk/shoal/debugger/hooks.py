"""Where the Debugger hook saves tensors (``debugger_hook_config=``), which collections it
saves, and where TensorBoard output goes (``tensorboard_output_config=``)."""

from __future__ import annotations

from typing import Any


class CollectionConfig:
    """A tensor collection the hook saves (``"losses"``, ``"weights"``...) and its parameters
    (``save_interval``, ``include_regex``...). Equal configurations count once in a request."""

    def __init__(self, name: str, parameters: dict[str, str] | None = None):
        self.name = name
        self.parameters = parameters

    def _key(self):
        return self.name, tuple(sorted((self.parameters or {}).items()))

    def __eq__(self, other) -> bool:
        if not isinstance(other, CollectionConfig):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"CollectionConfig(name={self.name!r}, parameters={self.parameters!r})"

    def _to_request_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"CollectionName": self.name}
        if self.parameters is not None:
            out["CollectionParameters"] = dict(self.parameters)
        return out


class DebuggerHookConfig:
    """The Debugger hook: output path (default: the estimator's output path), the
    container's local path, hook parameters, and the collections to save."""

    def __init__(self, s3_output_path: str | None = None,
                 container_local_output_path: str | None = None,
                 hook_parameters: dict[str, str] | None = None,
                 collection_configs: list[CollectionConfig] | None = None):
        self.s3_output_path = s3_output_path
        self.container_local_output_path = container_local_output_path
        self.hook_parameters = hook_parameters
        self.collection_configs = collection_configs

    def _to_request_dict(self, collections: list[CollectionConfig] | None = None,
                         default_output: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"S3OutputPath": self.s3_output_path or default_output}
        if self.container_local_output_path is not None:
            out["LocalPath"] = self.container_local_output_path
        if self.hook_parameters is not None:
            out["HookParameters"] = dict(self.hook_parameters)
        chosen = self.collection_configs if collections is None else collections
        if chosen is not None:
            out["CollectionConfigurations"] = [c._to_request_dict() for c in chosen]
        return out


class TensorBoardOutputConfig:
    """Where the job's TensorBoard data goes (and where the container writes it)."""

    def __init__(self, s3_output_path: str, container_local_output_path: str | None = None):
        self.s3_output_path = s3_output_path
        self.container_local_output_path = container_local_output_path

    def _to_request_dict(self) -> dict[str, Any]:
        out = {"S3OutputPath": self.s3_output_path}
        if self.container_local_output_path is not None:
            out["LocalPath"] = self.container_local_output_path
        return out

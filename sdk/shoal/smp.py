"""The model-parallel library's parameters (``smdistributed.modelparallel``'s ``parameters``).

``distribution['smdistributed']['modelparallel']['parameters']`` is a dict, or the path of a
JSON file holding one, that the training containers hand to ``smp.init()`` as the
``mp_parameters`` hyperparameter. It is checked here, once, against the library's documented
parameters: every name, type, range and allowed value, and the rules that tie them together.
The table itself lives in ``shoal.modelparallel.parameters``, which the runtime reads too.
Two tables exist: the MPI-launched library (v1, ``mpi`` enabled) and the torchrun-launched
library (v2, ``torch_distributed`` enabled). The parameters are kept exactly as written, so
that the hyperparameter Shoal sends is the one the SageMaker Python SDK v2 sends.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import attrs

from shoal.errors import DistributionError
from shoal.modelparallel import parameters as _table
from shoal.modelparallel.parameters import Param, parameter_table

_V1_PARAMETERS = _table.V1_PARAMETERS
_V2_PARAMETERS = _table.V2_PARAMETERS
_TENSOR_PLACEMENTS = _table.TENSOR_PLACEMENTS
_PLACEMENT_ALIASES = _table.PLACEMENT_ALIASES


@attrs.frozen
class ModelParallelParameters:
    """Validated model-parallel parameters, kept exactly as the user wrote them."""

    # Left out of the hash (a mapping has none); equality still compares it.
    values: Mapping[str, Any] = attrs.field(
        converter=lambda v: MappingProxyType(dict(v)), hash=False
    )
    torchrun: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The parameters as a plain dict (the ``mp_parameters`` hyperparameter's value)."""
        return json.loads(json.dumps(dict(self.values)))

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    @property
    def pipeline_parallel_degree(self) -> int:
        """Partitions of the model (``partitions`` and ``pipeline_parallel_degree`` are one)."""
        return self.values.get("pipeline_parallel_degree", self.values.get("partitions", 1))

    @property
    def tensor_parallel_degree(self) -> int:
        return self.values.get("tensor_parallel_degree", 1)

    @property
    def microbatches(self) -> int:
        return self.values.get("microbatches", 1)


def load_parameters(raw: Any, where: str) -> dict[str, Any]:
    """The parameters dict itself, or the JSON object read from the file ``raw`` names."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if not isinstance(raw, (str, os.PathLike)):
        raise DistributionError(f"{where} must be a dict or the path of a JSON file (got {raw!r})")
    if not os.path.isfile(raw):
        raise DistributionError(f"{where} names no existing JSON file (got {str(raw)!r})")
    try:
        with open(raw, encoding="utf-8") as handle:
            parsed = json.load(handle)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DistributionError(f"{where}: {str(raw)!r} is not valid JSON ({exc})") from exc
    if not isinstance(parsed, dict):
        raise DistributionError(f"{where}: {str(raw)!r} must hold a JSON object (got {parsed!r})")
    return parsed


def parse_parameters(
    raw: Any, *, where: str, framework: str | None, torchrun: bool = False
) -> ModelParallelParameters:
    """Validate model-parallel parameters (a dict or a JSON file path) for ``framework``.

    ``framework`` None (a custom image) accepts the parameters of every framework.
    Raises DistributionError naming the parameter's full path.
    """
    params = load_parameters(raw, where)
    table = parameter_table(torchrun)
    for key, value in params.items():
        _check_known(key, table, where, framework, torchrun)
        _check_value(value, table[key], f"{where}[{key!r}]")
    if not torchrun:
        _check_v1_rules(params, where, framework)
    return ModelParallelParameters(params, torchrun=torchrun)


def _check_known(key: Any, table: Mapping[str, Param], where: str, framework, torchrun) -> None:
    if key not in table:
        other = _V1_PARAMETERS if torchrun else _V2_PARAMETERS
        hint = _did_you_mean(key, table)
        if key in other:
            launcher = "'torch_distributed'" if not torchrun else "'mpi'"
            hint = f"; {key!r} is a parameter of the library launched with {launcher}"
        raise DistributionError(f"{where} has an unknown parameter {key!r}{hint}")
    allowed = table[key].frameworks
    if framework is not None and framework not in allowed:
        raise DistributionError(
            f"{where}[{key!r}] is a {' and '.join(allowed)} parameter; "
            f"it does not apply to {framework}"
        )


def _did_you_mean(key: Any, known) -> str:
    close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def _check_value(value: Any, param: Param, where: str) -> None:
    kind = param.kind
    if kind == "bool" and not isinstance(value, bool):
        raise DistributionError(f"{where} must be a bool (got {value!r})")
    if kind in ("str", "choice") and not isinstance(value, str):
        raise DistributionError(f"{where} must be a str (got {value!r})")
    if kind == "choice" and value not in param.choices:
        raise DistributionError(f"{where} must be one of {list(param.choices)} (got {value!r})")
    if kind == "int" and (isinstance(value, bool) or not isinstance(value, int)):
        raise DistributionError(f"{where} must be an int (got {value!r})")
    if kind == "count" and not _is_count(value):
        raise DistributionError(f"{where} must be a whole number (got {value!r})")
    if kind == "float" and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    ):
        raise DistributionError(f"{where} must be a finite number (got {value!r})")
    if param.minimum is not None and value < param.minimum:
        raise DistributionError(f"{where} must be >= {param.minimum} (got {value!r})")
    if param.maximum is not None and value > param.maximum:
        raise DistributionError(f"{where} must be <= {param.maximum} (got {value!r})")


def _is_count(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and value.is_integer())


def _check_v1_rules(params: dict[str, Any], where: str, framework: str | None) -> None:
    _check_partitions(params, where, framework)
    _check_placement_strategy(params, where, framework)
    _check_data_parallel_partner(params, where)
    if params.get("fp16") is True and params.get("bf16") is True:
        raise DistributionError(f"{where}: 'fp16' and 'bf16' cannot both be True")
    if params.get("tensor_parallel_degree", 1) > 1 and params.get("ddp") is not True:
        raise DistributionError(
            f"{where}['ddp'] must be True when 'tensor_parallel_degree' > 1 "
            f"(got tensor_parallel_degree={params['tensor_parallel_degree']}, "
            f"ddp={params.get('ddp')!r})"
        )


def _check_partitions(params: dict[str, Any], where: str, framework: str | None) -> None:
    if "partitions" in params and "pipeline_parallel_degree" in params:
        if params["partitions"] != params["pipeline_parallel_degree"]:
            raise DistributionError(
                f"{where}: 'partitions' ({params['partitions']}) and 'pipeline_parallel_degree' "
                f"({params['pipeline_parallel_degree']}) are the same setting and must agree"
            )
    if framework == "tensorflow" and "partitions" not in params:
        raise DistributionError(f"{where}['partitions'] is required for TensorFlow")
    partitions = params.get("pipeline_parallel_degree", params.get("partitions", 1))
    if params.get("auto_partition") is False and "default_partition" not in params:
        raise DistributionError(
            f"{where}['default_partition'] is required when 'auto_partition' is False"
        )
    if "default_partition" in params and params["default_partition"] >= partitions:
        raise DistributionError(
            f"{where}['default_partition'] must be < the number of partitions ({partitions}) "
            f"(got {params['default_partition']})"
        )


def _check_placement_strategy(params: dict[str, Any], where: str, framework) -> None:
    if "placement_strategy" not in params:
        return
    value = params["placement_strategy"]
    allowed = (
        _PLACEMENT_ALIASES
        if framework == "tensorflow"
        else (_PLACEMENT_ALIASES + _TENSOR_PLACEMENTS)
    )
    if value not in allowed:
        raise DistributionError(
            f"{where}['placement_strategy'] must be one of {list(allowed)} (got {value!r})"
        )


def _check_data_parallel_partner(params: dict[str, Any], where: str) -> None:
    if params.get("ddp") is True and params.get("horovod") is True:
        raise DistributionError(f"{where}: 'ddp' and 'horovod' cannot both be True")
    for key in ("ddp_port", "ddp_dist_backend"):
        if key in params and "ddp" not in params:
            raise DistributionError(f"{where}[{key!r}] needs 'ddp' to be set as well")

"""Which clients a deploy talks to: the session's boto3 ``sagemaker`` and ``sagemaker-runtime``,
or this machine's ``LocalEndpoints`` for ``instance_type="local"``/``"local_gpu"`` (and for a
session in local mode)."""

from __future__ import annotations

from shoal.frameworks import LOCAL_INSTANCE_TYPES


def is_local(instance_type: str | None, session) -> bool:
    if instance_type is not None:
        return instance_type in LOCAL_INSTANCE_TYPES
    return bool(getattr(session, "local_mode", False))


def endpoint_clients(instance_type: str | None, session):
    """(sagemaker client, runtime client) for endpoints of ``instance_type``."""
    if session is None or is_local(instance_type, session):
        from shoal.local.endpoints import LocalEndpoints

        local = LocalEndpoints(region=getattr(session, "region", None) or "us-east-1")
        return local, local
    return session.sagemaker_client, session.client("sagemaker-runtime")

"""Choosing the runner and building the non-MPI command lines (pure).

The runner follows the toolkits' order of precedence. A TensorFlow parameter-server job
(more than one host) wins; otherwise, for a host in a distribution instance group:
``sagemaker_mpi_enabled`` (MPI runner), ``sagemaker_pytorch_ddp_enabled`` and
``sagemaker_distributed_dataparallel_enabled`` (the data-parallel runner),
``sagemaker_torch_distributed_enabled`` (torchrun); else one process per host.
``sagemaker_multi_worker_mirrored_strategy_enabled`` adds ``TF_CONFIG`` to whichever runs.
"""

from __future__ import annotations

import enum
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from shoal.errors import DistributionError

TORCH_MASTER_PORT = "7777"
PS_MASTER_PORT = 2222
PS_SERVER_PORT = 2223
MWMS_PORT = 8890


class Runner(enum.Enum):
    PROCESS = "process"
    MPI = "mpi"
    DATAPARALLEL = "dataparallel"
    TORCH_DISTRIBUTED = "torch_distributed"
    PARAMETER_SERVER = "parameter_server"


def _flag(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes")
    return bool(value)


def _optional_int(value: Any) -> int | None:
    if value is None or value == "":
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise DistributionError(f"expected an integer (got {value!r})") from None


def _at_least_one(instance, attribute, value):
    if value is not None and value < 1:
        raise DistributionError(f"'{attribute.name}' must be >= 1 (got {value})")


@attrs.frozen
class Distribution:
    """The distribution settings among the framework parameters, parsed once."""

    mpi: bool = False
    pytorch_ddp: bool = False
    dataparallel: bool = False
    torch_distributed: bool = False
    parameter_server: bool = False
    multi_worker_mirrored: bool = False
    processes_per_host: int | None = attrs.field(default=None, validator=_at_least_one)
    num_processes: int | None = attrs.field(default=None, validator=_at_least_one)
    mpi_custom_options: str = ""
    dataparallel_custom_options: str = ""
    instance_type: str | None = None

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> Distribution:
        return cls(
            mpi=_flag(params.get("sagemaker_mpi_enabled")),
            pytorch_ddp=_flag(params.get("sagemaker_pytorch_ddp_enabled")),
            dataparallel=_flag(params.get("sagemaker_distributed_dataparallel_enabled")),
            torch_distributed=_flag(params.get("sagemaker_torch_distributed_enabled")),
            parameter_server=_flag(params.get("sagemaker_parameter_server_enabled")),
            multi_worker_mirrored=_flag(
                params.get("sagemaker_multi_worker_mirrored_strategy_enabled")
            ),
            processes_per_host=_optional_int(params.get("sagemaker_mpi_num_of_processes_per_host")),
            num_processes=_optional_int(params.get("sagemaker_mpi_num_processes")),
            mpi_custom_options=str(params.get("sagemaker_mpi_custom_mpi_options") or ""),
            dataparallel_custom_options=str(
                params.get("sagemaker_distributed_dataparallel_custom_mpi_options") or ""
            ),
            instance_type=params.get("sagemaker_instance_type"),
        )

    def ranks_per_host(self, num_gpus: int) -> int:
        """The override, else one process per GPU, else one."""
        return self.processes_per_host or (num_gpus if num_gpus > 0 else 1)


def choose_runner(dist: Distribution, num_hosts: int, in_distribution: bool = True) -> Runner:
    if dist.parameter_server and num_hosts > 1 and in_distribution:
        return Runner.PARAMETER_SERVER
    if not in_distribution:
        return Runner.PROCESS
    if dist.mpi:
        return Runner.MPI
    if dist.pytorch_ddp or dist.dataparallel:
        return Runner.DATAPARALLEL
    if dist.torch_distributed:
        return Runner.TORCH_DISTRIBUTED
    return Runner.PROCESS


def entry_point_kind(code_dir: str, entry_point: str) -> str:
    """``package`` (setup.py), ``program`` (.py) or ``command``, as the toolkit decides."""
    if os.path.exists(os.path.join(code_dir, "setup.py")):
        return "package"
    return "program" if entry_point.endswith(".py") else "command"


def user_command(
    kind: str, entry_point: str, args: Sequence[str], python: Sequence[str]
) -> list[str]:
    """The script's command line; ``python`` is the interpreter prefix (with ``-m mpi4py``)."""
    if kind == "package":
        return [*python, "-m", entry_point.replace(".py", ""), *args]
    if kind == "program":
        return [*python, entry_point, *args]
    quoted = " ".join(shlex.quote(a) for a in args)
    return ["/bin/sh", "-c", f"./{entry_point} {quoted}".rstrip()]


def torchrun_argv(
    hosts: Sequence[str],
    current_host: str,
    processes_per_host: int,
    entry_point: str,
    args: Sequence[str],
    *,
    master_addr: str | None = None,
    master_port: str = TORCH_MASTER_PORT,
    torchrun: str = "torchrun",
) -> list[str]:
    """The toolkit's torchrun command line (multi-node options for two or more hosts)."""
    if not entry_point.endswith(".py"):
        raise DistributionError(
            f"torch_distributed needs a Python script entry point (got {entry_point!r})"
        )
    argv = [torchrun, "--nnodes", str(len(hosts)), "--nproc_per_node", str(processes_per_host)]
    if len(hosts) > 1:
        argv += ["--master_addr", master_addr or hosts[0], "--master_port", master_port,
                 "--node_rank", str(list(hosts).index(current_host))]  # fmt: skip
    return [*argv, entry_point, *args]


# Simulated hosts share one machine: each TensorFlow task gets its own loopback address
# there, from this table (JSON {host: {"task": "ip:port", "ps": "ip:port"}}, written per job).
TF_ADDRESSES_ENV = "SHOAL_TF_ADDRESSES"

TfAddresses = Mapping[str, Mapping[str, str]]


def _addresses(
    hosts: Sequence[str], port: int, table: TfAddresses | None = None, role: str = "task"
) -> list[str]:
    if table is not None:
        return [table[h][role] for h in hosts]
    return [f"{h}:{port}" for h in hosts]


def simulated_tf_addresses(hosts: Sequence[str], free_port) -> dict[str, dict[str, str]]:
    """A loopback address per task and per parameter server of every simulated host."""
    return {h: {"task": f"127.0.0.1:{free_port()}", "ps": f"127.0.0.1:{free_port()}"}
            for h in hosts}  # fmt: skip


def parameter_server_tf_config(
    hosts: Sequence[str], current_host: str, ps_task: bool = False,
    table: TfAddresses | None = None,
) -> dict:
    """TF_CONFIG of the toolkit's parameter-server setup (master, workers, one ps per host);
    ``table`` replaces ``host:port`` with simulated hosts' own addresses."""
    hosts = list(hosts)
    workers = hosts[1:]
    config: dict = {"cluster": {"master": _addresses(hosts[:1], PS_MASTER_PORT, table)},
                    "environment": "cloud"}  # fmt: skip
    if len(hosts) > 1:
        config["cluster"]["ps"] = _addresses(hosts, PS_SERVER_PORT, table, "ps")
    if workers:
        config["cluster"]["worker"] = _addresses(workers, PS_MASTER_PORT, table)
    if ps_task:
        if len(hosts) < 2:
            raise DistributionError("a parameter server task needs two or more hosts")
        task = {"index": hosts.index(current_host), "type": "ps"}
    elif current_host == hosts[0]:
        task = {"index": 0, "type": "master"}
    else:
        task = {"index": workers.index(current_host), "type": "worker"}
    config["task"] = task
    return config


def multi_worker_mirrored_tf_config(
    hosts: Sequence[str], current_host: str, table: TfAddresses | None = None
) -> dict:
    """TF_CONFIG of MultiWorkerMirroredStrategy: every host a worker."""
    hosts = list(hosts)
    return {
        "cluster": {"worker": _addresses(hosts, MWMS_PORT, table)},
        "environment": "cloud",
        "task": {"index": hosts.index(current_host), "type": "worker"},
    }

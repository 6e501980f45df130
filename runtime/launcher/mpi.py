"""The mpirun command lines of the MPI and data-parallel runners (pure).

The tokens and their order are those of the SageMaker training toolkit's ``mpi.py``
(``MasterRunner``) and ``smdataparallel.py`` (``SMDataParallelRunner``) for the same
configuration, with Shoal's per-rank wrapper ``shoal-rank`` where the closed ``smddprun``
(or ``smddpmprun``) stood. Deliberate differences:

* AWS credential variables are never forwarded: the toolkit's ``-x AWS_ACCESS_KEY_ID``
  (and friends) are not emitted, and ``-x`` of a credential in ``custom_mpi_options`` is
  dropped with a warning. Ranks get credentials from the instance role like any process.
* ``LD_PRELOAD=<gethostname shim>`` is emitted only when a shim library is given.
* ``custom_mpi_options`` is split with shell rules (quotes kept together).
* Simulated hosts (:mod:`shoal.launcher.simulate`) and a platform that starts the other
  hosts' daemons itself (``SHOAL_RSH_AGENT``: a Slurm job, as job steps) add
  ``-mca plm_rsh_agent <agent>`` just before the command; no sshd is started or waited for.
"""

from __future__ import annotations

import argparse
import logging
import re
import shlex
from collections.abc import Sequence

import attrs
from shoal.errors import DistributionError

log = logging.getLogger(__name__)

EFA_NCCL_INSTANCES = (
    "ml.g4dn.8xlarge",
    "ml.g4dn.12xlarge",
    "ml.g5.48xlarge",
    "ml.p3dn.24xlarge",
    "ml.p4d.24xlarge",
    "ml.p4de.24xlarge",
    "ml.p5.48xlarge",
    "ml.trn1.32xlarge",
)
EFA_RDMA_INSTANCES = ("ml.p4d.24xlarge", "ml.p4de.24xlarge", "ml.trn1.32xlarge")

DATAPARALLEL_SERVER_PORT = 7592
RANK_WRAPPER = "shoal-rank"
RSH_AGENT_ENV = "SHOAL_RSH_AGENT"

CREDENTIAL = re.compile(r"^AWS_.*(SECRET|KEY|TOKEN|PASSWORD|CREDENTIAL)", re.IGNORECASE)


@attrs.frozen
class CustomOptions:
    """``custom_mpi_options`` parsed: the ``--NCCL_DEBUG`` override and the rest."""

    nccl_debug: str = "INFO"
    extra: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


def _split_credentials(tokens: list[str]) -> tuple[list[str], list[str]]:
    kept: list[str] = []
    dropped: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in ("-x", "--x") and i + 1 < len(tokens):
            name = tokens[i + 1].split("=", 1)[0]
            if CREDENTIAL.match(name):
                dropped.append(name)
                i += 2
                continue
        kept.append(tok)
        i += 1
    return kept, dropped


def parse_custom_mpi_options(text: str | None) -> CustomOptions:
    """Parse like the toolkit (argparse ``--NCCL_DEBUG``, unknown tokens kept in order)."""
    try:
        tokens = shlex.split(text or "")
    except ValueError as e:
        raise DistributionError(f"'custom_mpi_options' cannot be parsed: {e}") from None
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--NCCL_DEBUG", default="INFO", type=str)
    known, rest = parser.parse_known_args(tokens)
    kept, dropped = _split_credentials(rest)
    for name in dropped:
        log.warning("custom_mpi_options: not forwarding credential variable %s to ranks", name)
    return CustomOptions(nccl_debug=known.NCCL_DEBUG, extra=tuple(kept), dropped=tuple(dropped))


def _positive(instance, attribute, value):
    if value is not None and value < 1:
        raise DistributionError(f"'{attribute.name}' must be >= 1 (got {value})")


@attrs.frozen
class MpiPlan:
    """Everything the mpirun command line depends on."""

    hosts: tuple[str, ...] = attrs.field(converter=tuple)
    processes_per_host: int = attrs.field(validator=_positive)
    network_interface: str = "eth0"
    instance_type: str | None = None
    custom_mpi_options: str = ""
    num_processes: int | None = attrs.field(default=None, validator=_positive)
    preload: str | None = None
    env_names: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    rsh_agent: str | None = None
    rank_wrapper: str = RANK_WRAPPER

    @property
    def master(self) -> str:
        return self.hosts[0]

    @property
    def total_processes(self) -> int:
        return self.num_processes or self.processes_per_host * len(self.hosts)


def _common_mca(iface: str) -> list[str]:
    return [
        "-mca", "btl_tcp_if_include", iface,
        "-mca", "oob_tcp_if_include", iface,
        "-mca", "plm_rsh_no_tree_spawn", "1",
    ]  # fmt: skip


def _efa_tokens(instance_type: str | None, *, provider: bool) -> list[str]:
    tokens: list[str] = []
    if instance_type in EFA_NCCL_INSTANCES:
        tokens += (["-x", "FI_PROVIDER=efa"] if provider else []) + ["-x", "NCCL_PROTO=simple"]
    if instance_type in EFA_RDMA_INSTANCES:
        tokens += ["-x", "FI_EFA_USE_DEVICE_RDMA=1"]
    return tokens


def _tail(plan: MpiPlan, command: Sequence[str]) -> list[str]:
    agent = ["-mca", "plm_rsh_agent", plan.rsh_agent] if plan.rsh_agent else []
    return agent + [plan.rank_wrapper, *command]


def mpi_argv(plan: MpiPlan, command: Sequence[str]) -> list[str]:
    """The MPI runner's mpirun argv (toolkit ``MasterRunner``) around ``command``."""
    options = parse_custom_mpi_options(plan.custom_mpi_options)
    ppn = plan.processes_per_host
    host_list = list(plan.hosts) if ppn == 1 else [f"{h}:{ppn}" for h in plan.hosts]
    iface = plan.network_interface
    argv = ["mpirun", "--host", ",".join(host_list), "-np", str(plan.total_processes),
            "--allow-run-as-root", "--display-map", "--tag-output", *_common_mca(iface),
            "-bind-to", "none", "-map-by", "slot",
            "-mca", "pml", "ob1", "-mca", "btl", "^openib",
            "-mca", "orte_abort_on_non_zero_status", "1",
            "-mca", "btl_vader_single_copy_mechanism", "none",
            "-x", "NCCL_MIN_NRINGS=4", "-x", f"NCCL_SOCKET_IFNAME={iface}",
            "-x", f"NCCL_DEBUG={options.nccl_debug}",
            "-x", "LD_LIBRARY_PATH", "-x", "PATH"]  # fmt: skip
    if plan.preload:
        argv += ["-x", f"LD_PRELOAD={plan.preload}"]
    argv += list(options.extra)
    argv += _efa_tokens(plan.instance_type, provider=True)
    for name in plan.env_names:
        if not CREDENTIAL.match(name):
            argv += ["-x", name]
    return argv + _tail(plan, command)


def dataparallel_argv(plan: MpiPlan, command: Sequence[str]) -> list[str]:
    """The data-parallel runner's mpirun argv (toolkit ``SMDataParallelRunner``)."""
    options = parse_custom_mpi_options(plan.custom_mpi_options)
    multi = len(plan.hosts) > 1
    ppn = plan.processes_per_host
    host_list = [f"{h}:{ppn}" for h in plan.hosts] if multi else list(plan.hosts)
    flag = "SMDATAPARALLEL_USE_HOMOGENEOUS=1" if multi else "SMDATAPARALLEL_USE_SINGLENODE=1"
    iface = plan.network_interface
    argv = ["mpirun", "--host", ",".join(host_list), "-np", str(ppn * len(plan.hosts)),
            "--allow-run-as-root", "--tag-output", "--oversubscribe", *_common_mca(iface),
            "-mca", "pml", "ob1", "-mca", "btl", "^openib",
            "-mca", "orte_abort_on_non_zero_status", "1",
            "-mca", "btl_vader_single_copy_mechanism", "none",
            "-mca", "plm_rsh_num_concurrent", str(len(plan.hosts)),
            "-x", f"NCCL_SOCKET_IFNAME={iface}", "-x", f"NCCL_DEBUG={options.nccl_debug}",
            "-x", "LD_LIBRARY_PATH", "-x", "PATH", "-x", flag,
            "-x", "FI_PROVIDER=efa", "-x", "RDMAV_FORK_SAFE=1"]  # fmt: skip
    if plan.preload:
        argv += ["-x", f"LD_PRELOAD={plan.preload}"]
    argv += list(options.extra)
    argv += _efa_tokens(plan.instance_type, provider=False)
    if multi:
        argv += ["-x", f"SMDATAPARALLEL_SERVER_ADDR={plan.master}",
                 "-x", f"SMDATAPARALLEL_SERVER_PORT={DATAPARALLEL_SERVER_PORT}",
                 "-x", f"SAGEMAKER_INSTANCE_TYPE={plan.instance_type}"]  # fmt: skip
    return argv + _tail(plan, command)

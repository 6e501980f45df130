"""The batch script of one training job (pure: a request and settings in, text out).

One ``sbatch`` per CreateTrainingJob: a node per instance, whole nodes (``--exclusive``: an
instance is the job's alone, as on SageMaker), the job's name, its partition from the instance
type, a time limit of ``MaxRuntimeInSeconds`` plus ``UPLOAD_MARGIN_SECONDS`` (the supervisor
enforces the run time itself and still needs to upload; Slurm's limit is the backstop), its
output appended to the job's ``logs.txt``, and no requeue unless the job checkpoints (Slurm
requeues by default, which would start a job with nothing to resume from again from the top).

The script runs the job's supervisor (``shoal.local.runner``) on the allocation's first node
with ``SHOAL_BACKEND=slurm``: it lays out every host's /opt/ml on the shared directory and
starts one launcher per node through ``srun`` (``shoal.slurm.hosts``).
"""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from shoal.errors import ConfigError

from .settings import SlurmSettings

UPLOAD_MARGIN_SECONDS = 15 * 60
SCRIPT_NAME = "sbatch.sh"


def node_count(request: dict) -> int:
    groups = request["ResourceConfig"].get("InstanceGroups")
    if groups:
        return sum(int(g["InstanceCount"]) for g in groups)
    return int(request["ResourceConfig"]["InstanceCount"])


def partition(request: dict, settings: SlurmSettings) -> str | None:
    """The job's partition. Instance groups that map to different partitions would need a
    heterogeneous job: refused, with what each group maps to."""
    config = request["ResourceConfig"]
    groups = config.get("InstanceGroups")
    if not groups:
        return settings.partition_for(config.get("InstanceType"))
    chosen = {g["InstanceGroupName"]: settings.partitions.get(
        g["InstanceGroupName"], settings.partition_for(g["InstanceType"])) for g in groups}
    if len(set(chosen.values())) > 1:
        raise ConfigError(f"the instance groups map to different Slurm partitions ({chosen}): "
                          "one partition per job is supported (map them to one)")
    return next(iter(chosen.values()))


def time_limit_minutes(request: dict) -> int:
    run = int(request.get("StoppingCondition", {}).get("MaxRuntimeInSeconds", 86400))
    return math.ceil((run + UPLOAD_MARGIN_SECONDS) / 60)


def _checkpoints(request: dict) -> bool:
    return bool((request.get("CheckpointConfig") or {}).get("S3Uri"))


def directives(request: dict, job_dir: Path, settings: SlurmSettings) -> list[str]:
    if any(c.isspace() for c in str(job_dir)):
        raise ConfigError(f"the job's directory may not contain spaces for Slurm ({job_dir}): "
                          "choose a shared_dir without them")
    # --wait-all-nodes: the script starts once every node has booted (a cloud or power-saving
    # partition's nodes come up one by one; the hosts' srun would otherwise wait on them)
    options = [f"--job-name={request['TrainingJobName']}", f"--nodes={node_count(request)}",
               "--ntasks-per-node=1", "--exclusive", "--wait-all-nodes=1",
               f"--time={time_limit_minutes(request)}",
               f"--output={job_dir / 'logs.txt'}", "--open-mode=append", f"--chdir={job_dir}",
               "--comment=shoal-training-job",
               "--requeue" if _checkpoints(request) else "--no-requeue"]
    chosen = partition(request, settings)
    options += [f"--{k}={v}" for k, v in (("partition", chosen), ("account", settings.account),
                                          ("qos", settings.qos)) if v]
    return options + list(settings.sbatch_options)


def script(request: dict, job_dir: Path, settings: SlurmSettings) -> str:
    lines = ["#!/bin/bash", f"# Shoal training job {request['TrainingJobName']}"]
    lines += [f"#SBATCH {option}" for option in directives(request, job_dir, settings)]
    lines += ["export SHOAL_BACKEND=slurm PYTHONUNBUFFERED=1",
              f"exec {shlex.quote(settings.python)} -u -m shoal.local.runner "
              f"{shlex.quote(str(job_dir))}", ""]
    return "\n".join(lines)

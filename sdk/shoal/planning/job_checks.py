"""The advisor's checks of the job description: hosts, image, storage, hyperparameters,
MPI options, profiler and the model-parallel microbatches."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from shoal import inputs as inputs_
from shoal.containers import matrix
from shoal.planning import sizing
from shoal.planning.findings import Finding, JobView

# The tips, by their titles in the libraries' documentation.
TIP_NODES = "Single Versus Multiple Nodes"
TIP_CUDA = "Distributed data parallel: Important (CUDA 11 only)"
TIP_FSX = "Use Amazon FSx and set up an optimal storage and throughput capacity"
TIP_BATCH = "Batch Size"
TIP_MPI = "Custom MPI Options"
TIP_DEBUGGER = "Debug Scaling Efficiency with Debugger"
TIP_MICROBATCHES = "Batch Size and Number of Microbatches"


def check_single_host(job: JobView) -> list[Finding]:
    if not job.dataparallel or job.instance_count != 1:
        return []
    gpus = sizing.gpus_per_instance(job.config.instance_type)
    severity = "warning" if gpus in (None, 1) else "info"
    return [Finding(
        "SHOAL-DP001", severity,
        f"the data-parallel library runs on a single host ({job.config.instance_type}, "
        "instance_count 1): its AllReduce pays off with two or more nodes, and inside one "
        "host NVLink already makes AllReduce efficient",
        "use instance_count >= 2 of a multi-GPU instance type, or plain torch DDP / "
        "MirroredStrategy on one host",
        TIP_NODES)]


_CUDA_MARK = re.compile(r"(?:^|[^a-z0-9])cu(?:da)?[-_.:]?(\d{2,3})(?:\.(\d))?", re.IGNORECASE)
_SHOAL_IMAGE = re.compile(r"/shoal-(?P<fw>[a-z]+)-training:(?P<ver>[\d.]+)-(?P<proc>gpu|cpu)-"
                          r"(?P<py>py\d+)$")


def image_cuda_major(image_uri: str) -> int | None:
    """The CUDA major version an image's name or tag states (cu113 -> 11, cuda12.1 -> 12)."""
    shoal = _SHOAL_IMAGE.search(image_uri)
    if shoal:
        spec = matrix.find(shoal["fw"], shoal["ver"], shoal["py"])
        return int(spec.cuda.split(".")[0]) if spec else None
    match = _CUDA_MARK.search(image_uri.rsplit("/", 1)[-1])
    if not match:
        return None
    digits = match[1]
    if match[2] is not None:
        return int(digits)
    # cu113 is 11.3 and cu92 is 9.2: a leading 1 starts a two-digit major version
    return int(digits[:2]) if digits.startswith("1") else int(digits[0])


def check_image_cuda(job: JobView) -> list[Finding]:
    if not job.dataparallel or not job.image_uri:
        return []
    major = image_cuda_major(job.image_uri)
    if major == 11:
        return []
    fix = ("build the image from a CUDA 11 base (or use Shoal's image: leave image_uri unset, "
           "see containers/matrix.yaml)")
    if major is None:
        return [Finding("SHOAL-DP002", "info",
                        f"cannot tell the CUDA version of image {job.image_uri!r}: the "
                        "data-parallel library supports only CUDA 11", fix, TIP_CUDA)]
    return [Finding("SHOAL-DP002", "error",
                    f"image {job.image_uri!r} is built for CUDA {major}: the data-parallel "
                    "library supports only CUDA 11", fix, TIP_CUDA)]


def _file_mode(job: JobView, value) -> bool:
    own = getattr(value, "input_mode", None)
    return (own or job.config.input_mode) == "File"


def check_storage(job: JobView) -> list[Finding]:
    """Multi-node data parallel: S3 File mode -> FSx for Lustre; size FSx from the hints."""
    if not job.dataparallel or job.instance_count < 2:
        return []
    findings = []
    s3_file = [name for name, value in job.inputs.items()
               if isinstance(value, inputs_.TrainingInput) and _file_mode(job, value)]
    hints = job.hints
    if s3_file:
        size = f" ({hints.dataset_gb:g} GB)" if hints.dataset_gb else ""
        findings.append(Finding(
            "SHOAL-DP005", "warning" if hints.dataset_gb else "info",
            f"channels {s3_file} copy the data set{size} from S3 in File mode to each of "
            f"{job.instance_count} nodes before training starts",
            "use FSx for Lustre (FileSystemInput) for large data sets, or input_mode="
            "'FastFile' to stream from S3",
            TIP_FSX))
    if hints.dataset_gb and hints.epoch_seconds:
        findings.append(_fsx_finding(job))
    return findings


def _fsx_finding(job: JobView) -> Finding:
    plan = sizing.plan_fsx(job.hints.dataset_gb, job.hints.epoch_seconds, job.instance_count)
    smallest = plan.option("SCRATCH_2")
    return Finding(
        "SHOAL-DP006", "info",
        f"reading {plan.dataset_gb:g} GB every {plan.epoch_seconds:g} s needs about "
        f"{plan.required_mbps / 1000:.1f} GB/s of storage throughput; FSx for Lustre SCRATCH_2 "
        f"at its minimum {smallest.minimum_storage_gib / 1000:.1f} TiB gives "
        f"{smallest.minimum_throughput_mbps:.0f} MB/s",
        f"size FSx for Lustre to at least {smallest.storage_gib / 1000:.1f} TiB of SCRATCH_2 "
        f"({smallest.throughput_mbps:.0f} MB/s), see 'shoal plan fsx'; {plan.note}",
        TIP_FSX)



BATCH_KEYS = ("batch_size", "batch-size", "train_batch_size", "train-batch-size",
              "per_device_train_batch_size", "batch")
LR_KEYS = ("lr", "learning_rate", "learning-rate", "base_lr")


def _number(hyperparameters: Mapping[str, Any], keys, kind):
    for key in keys:
        value = hyperparameters.get(key)
        try:
            number = kind(value) if value is not None and not isinstance(value, bool) else None
        except (TypeError, ValueError):
            continue
        if number is not None and number > 0:
            return key, number
    return None, None


def check_batch_scaling(job: JobView) -> list[Finding]:
    dist = job.distribution
    data_parallel = dist is not None and dist.runner in ("smddp", "mpi", "torch_distributed",
                                                         "mwms")
    if not data_parallel or job.modelparallel:
        return []
    batch_key, batch = _number(job.hyperparameters, BATCH_KEYS, int)
    lr_key, lr = _number(job.hyperparameters, LR_KEYS, float)
    per_host = job.processes_per_host
    if batch is None or lr is None or not per_host:
        return []
    processes = per_host * job.instance_count
    if processes < 2:
        return []
    plan = sizing.scale_learning_rate(lr, batch, batch * processes)
    return [Finding(
        "SHOAL-DP008", "info",
        f"the global batch is {plan.new_global_batch} ({batch_key}={batch} x {processes} "
        f"processes): with {lr_key}={lr:g} tuned for a batch of {batch}, the linear scaling "
        f"rule gives {plan.scaled_lr:g}",
        f"scale the learning rate by {plan.factor:g} to {plan.scaled_lr:g} with a gradual "
        "warm-up from the base rate (e.g. over the first 5 epochs), see 'shoal plan lr'",
        TIP_BATCH)]


_DEBUG_NCCL = re.compile(r"NCCL_DEBUG=(INFO|TRACE|WARN|VERSION)", re.IGNORECASE)


def check_mpi_options(job: JobView) -> list[Finding]:
    dist = job.distribution
    options = None
    if job.dataparallel:
        options = dist.smdistributed.dataparallel.custom_mpi_options
    elif dist is not None and dist.mpi_enabled:
        options = dist.mpi.custom_mpi_options
    if not options:
        return []
    findings = []
    match = _DEBUG_NCCL.search(options)
    if match and match[1].upper() in ("INFO", "TRACE"):
        findings.append(Finding(
            "SHOAL-DP009", "warning",
            f"custom_mpi_options sets NCCL_DEBUG={match[1]}: every rank logs every NCCL "
            "call, which slows training and floods the job's log",
            "use NCCL_DEBUG=VERSION (prints the NCCL version once) or drop it outside "
            "debugging", TIP_MPI))
    elif match or re.search(r"(^|\s)-verbose\b", options):
        findings.append(Finding(
            "SHOAL-DP009", "info",
            f"custom_mpi_options {options!r} adds debugging output (e.g. -verbose, "
            "NCCL_DEBUG=VERSION)",
            "keep these for debugging runs; remove them for production jobs", TIP_MPI))
    return findings


def check_debugger(job: JobView) -> list[Finding]:
    if not job.config.disable_profiler or job.instance_count < 2:
        return []
    return [Finding(
        "SHOAL-DP010", "info",
        f"the profiler is disabled on a {job.instance_count}-node job: scaling problems "
        "(CPU bottlenecks, unbalanced ranks, idle GPUs) go unseen",
        "enable Debugger's CPUBottleneck, LoadBalancing and LowGPUUtilization rules to "
        "monitor scaling efficiency", TIP_DEBUGGER)]


# ---------------------------------------------------------------- model-parallel checks


def mp_parameters(job: JobView):
    """The model-parallel library's parameters, None when the job does not use it."""
    if not job.modelparallel:
        return None
    return job.distribution.smdistributed.modelparallel.parameters


def check_microbatches(job: JobView) -> list[Finding]:
    params = mp_parameters(job)
    if params is None:
        return []
    count = params.microbatches
    findings = []
    _, batch = _number(job.hyperparameters, BATCH_KEYS, int)
    if batch is not None and batch % count:
        valid = sizing.plan_microbatches(batch).valid
        findings.append(Finding(
            "SHOAL-MP001", "error",
            f"microbatches ({count}) does not divide the batch size ({batch})",
            f"use a microbatch count that divides {batch}: {list(valid)}", TIP_MICROBATCHES))
    elif batch is not None and job.hints.dataset_size:
        plan = sizing.plan_microbatches(batch, (count,), job.hints.dataset_size)
        if plan.options and plan.options[0].drop_last:
            findings.append(Finding(
                "SHOAL-MP002", "warning",
                f"the epoch's last batch holds {plan.last_batch} samples, not divisible by "
                f"{count} microbatches", DROP_FIX, TIP_MICROBATCHES))
    if count == 1 or (batch is not None and batch // count < 2) or count > 32:
        findings.append(Finding(
            "SHOAL-MP003", "info",
            f"microbatches is {count}: too few leaves the pipeline idle, too many makes each "
            "microbatch too small to use a GPU",
            "start with 2 or 4 microbatches and the largest batch that fits, then experiment "
            "(see 'shoal plan microbatches')", TIP_MICROBATCHES))
    return findings


# Also the fix of script_checks' drop_last check: one last-batch pitfall, two ways to find it.
DROP_FIX = ("set drop_last=True in the DataLoader (PyTorch) or drop_remainder=True in "
            "tf.data's batch() (TensorFlow), or skip the last batch by hand")

"""The advisor: the distributed libraries' documented tips and pitfalls, checked against a job.

:func:`advise` looks at an estimator (its parsed ``TrainingConfig`` and ``Distribution``, its
hyperparameters and image), the ``fit()`` inputs and, when given, the training script's text,
and returns :class:`Finding` objects: a stable code, a severity, what is wrong, how to fix it
and the tip it comes from. It is pure apart from optional, injected clients (``s3_client``
for GetBucketLocation, ``ec2_client`` for the subnets' region).

:func:`review` is what ``fit()`` calls: it logs each finding once per estimator on the
``shoal.advisor`` logger, and in strict mode (``advice="strict"`` or ``SHOAL_ADVICE=strict``)
raises ``ValidationError`` for error findings; ``SHOAL_ADVICE=off`` silences it.
"""

from __future__ import annotations

import ast
import functools
import logging
import os
import re
from collections.abc import Mapping
from typing import Any

import attrs
import botocore.exceptions
import botocore.session

from shoal import config as config_mod
from shoal import inputs as inputs_
from shoal.planning import sizing
from shoal.config import PROCESSES_PER_HOST_HP
from shoal.containers import matrix
from shoal.errors import ValidationError
from shoal.request import TrainingConfig

log = logging.getLogger("shoal.advisor")

SEVERITIES = ("info", "warning", "error")
MODES = ("warn", "strict", "off")
LOG_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
ENV_MODE = "SHOAL_ADVICE"

# The tips, by their titles in the libraries' documentation.
TIP_PREPROCESSING = "Data Preprocessing"
TIP_NODES = "Single Versus Multiple Nodes"
TIP_DEBUGGER = "Debug Scaling Efficiency with Debugger"
TIP_BATCH = "Batch Size"
TIP_MPI = "Custom MPI Options"
TIP_FSX = "Use Amazon FSx and set up an optimal storage and throughput capacity"
TIP_CUDA = "Distributed data parallel: Important (CUDA 11 only)"
TIP_REGION = "Customize your training script"
TIP_MICROBATCHES = "Batch Size and Number of Microbatches"
TIP_PARTITIONING = "Manual Partitioning"
TIP_DATA_PREPARATION = "Data Preparation"
TIP_RETURNING = "Returning Tensors from smp.DistributedModel"
TIP_STEP = "The @smp.step Decorator"


@attrs.frozen
class Finding:
    """One piece of advice about a job."""

    code: str = attrs.field(validator=attrs.validators.matches_re(r"SHOAL-[A-Z]+\d{3}"))
    severity: str = attrs.field(validator=attrs.validators.in_(SEVERITIES))
    message: str
    fix: str
    source: str

    def to_dict(self) -> dict[str, str]:
        return attrs.asdict(self)


@attrs.frozen
class Hints:
    """What the user knows about the data that the job description does not say."""

    dataset_gb: float | None = None
    epoch_seconds: float | None = None
    dataset_size: int | None = None  # samples, for the model-parallel last-batch check


@attrs.frozen
class JobView:
    """The parts of a job the checks read, taken from an estimator's parsed objects."""

    config: Any  # shoal.request.TrainingConfig
    distribution: Any = None  # shoal.distribution.Distribution
    hyperparameters: Mapping[str, Any] = attrs.field(factory=dict)
    image_uri: str | None = None  # the user's own image, None for Shoal's
    framework: str | None = None
    framework_version: str | None = None
    py_version: str | None = None
    inputs: Mapping[str, Any] = attrs.field(factory=dict)
    region: str | None = None
    script_text: str | None = None
    hints: Hints = Hints()

    @property
    def dataparallel(self) -> bool:
        return bool(self.distribution is not None and self.distribution.smdataparallel_enabled)

    @property
    def modelparallel(self) -> bool:
        return bool(self.distribution is not None and self.distribution.modelparallel_enabled)

    @property
    def instance_count(self) -> int:
        groups = self.config.instance_groups
        if groups:
            return sum(group.instance_count for group in groups)
        return self.config.instance_count or 1

    @property
    def processes_per_host(self) -> int | None:
        """Ranks per host: mpi's setting, the launcher's hyperparameter, else one per GPU."""
        per_host = self.distribution.processes_per_host if self.distribution else None
        per_host = per_host or _positive_int(self.hyperparameters.get(PROCESSES_PER_HOST_HP))
        return per_host or sizing.gpus_per_instance(self.config.instance_type)


def _positive_int(value) -> int | None:
    try:
        number = int(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
    return number if number and number > 0 else None


# ---------------------------------------------------------------- entry points


def advise(estimator_or_config, inputs=None, *, region: str | None = None,
           script_text: str | None = None, s3_client=None, ec2_client=None,
           dataset_gb: float | None = None, epoch_seconds: float | None = None,
           dataset_size: int | None = None) -> list[Finding]:
    """Every finding for a job, errors first.

    ``estimator_or_config`` is a Shoal estimator, a job file's ``JobSpec`` (its inputs and
    region are the defaults), a ``TrainingConfig`` alone, or a ``JobView``. ``region``
    defaults to the estimator's session's (none in local mode: no region check).
    ``dataset_gb``/``epoch_seconds`` size FSx for Lustre; ``dataset_size`` (samples) checks
    the last batch against the model-parallel microbatches.
    """
    hints = Hints(dataset_gb, epoch_seconds, dataset_size)
    job = view(estimator_or_config, inputs, region=region, script_text=script_text, hints=hints)
    findings: list[Finding] = []
    for check in CHECKS:
        findings.extend(check(job))
    findings.extend(check_input_regions(job, s3_client=s3_client, ec2_client=ec2_client))
    order = {severity: rank for rank, severity in enumerate(reversed(SEVERITIES))}
    return sorted(findings, key=lambda f: (order[f.severity], f.code))


def view(estimator_or_config, inputs=None, *, region=None, script_text=None,
         hints: Hints = Hints()) -> JobView:
    """The ``JobView`` of an estimator (a ``JobView`` is taken as is, with the arguments)."""
    parsed = inputs_.parse_inputs(inputs)
    if isinstance(estimator_or_config, JobView):
        job = estimator_or_config
        changes = {"hints": hints, "inputs": parsed or job.inputs}
        changes["region"] = region or job.region
        changes["script_text"] = script_text if script_text is not None else job.script_text
        return attrs.evolve(job, **changes)
    if isinstance(estimator_or_config, config_mod.JobSpec):
        spec = estimator_or_config
        return view(estimator_for_spec(spec), inputs if inputs is not None else spec.inputs,
                    region=region or spec.region, script_text=script_text, hints=hints)
    if isinstance(estimator_or_config, TrainingConfig):
        return JobView(config=estimator_or_config, inputs=parsed, region=region,
                       script_text=script_text, hints=hints)
    est = estimator_or_config
    if not hasattr(est, "config"):
        raise TypeError("advise() needs a Shoal estimator, a JobSpec, a TrainingConfig or a "
                        f"JobView (got {type(est).__name__})")
    session = getattr(est, "sagemaker_session", None)
    if region is None and session is not None and not est.config.local_mode:
        region = getattr(session, "region", None)
    return JobView(
        config=est.config, distribution=getattr(est, "distribution_config", None),
        hyperparameters=dict(getattr(est, "_hyperparameters", {}) or {}),
        image_uri=getattr(est, "image_uri", None), framework=est._framework_name,
        framework_version=getattr(est, "framework_version", None),
        py_version=getattr(est, "py_version", None), inputs=parsed, region=region,
        script_text=script_text, hints=hints)


def estimator_for_spec(spec):
    """A job file's estimator, built without any AWS call (its session only has a region)."""
    import boto3

    from shoal.session import LOCAL_REGION, Session

    session = Session(boto_session=boto3.Session(region_name=spec.region or LOCAL_REGION),
                      local_mode=spec.is_local)
    return config_mod.build_estimator(spec, sagemaker_session=session)


def mode(option: str | None = None) -> str:
    """The advice mode: the estimator's option, else ``$SHOAL_ADVICE``, else "warn"."""
    value = option if option is not None else os.environ.get(ENV_MODE) or "warn"
    if value not in MODES:
        where = "advice" if option is not None else ENV_MODE
        raise ValidationError(f"'{where}' must be in {MODES!r} (got {value!r})")
    return value


def review(estimator, inputs=None) -> list[Finding]:
    """Run the advisor for ``fit()``: log new findings once; strict mode rejects errors."""
    current = mode(getattr(estimator, "advice", None))
    if current == "off":
        return []
    findings = advise(estimator, inputs, script_text=read_script(estimator.config))
    seen = estimator.__dict__.setdefault("_advice_logged", set())
    for finding in findings:
        if finding not in seen:
            seen.add(finding)
            log.log(LOG_LEVELS[finding.severity], "%s %s: %s Fix: %s", finding.code,
                    finding.severity, finding.message, finding.fix)
    errors = [f for f in findings if f.severity == "error"]
    if current == "strict" and errors:
        raise ValidationError("the advisor found errors (strict mode): "
                              + "; ".join(f"{f.code}: {f.message}" for f in errors))
    return findings


MAX_SCRIPT_BYTES = 1 << 20


def read_script(config) -> str | None:
    """The entry point's text when it is a local file (at most 1 MiB), else None."""
    entry = config.entry_point
    if not entry:
        return None
    source = config.source_dir
    if source and "://" in source:
        return None
    path = os.path.join(source, entry) if source else entry
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(MAX_SCRIPT_BYTES)
    except OSError:
        return None


# ---------------------------------------------------------------- data-parallel checks


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


# What CPU-bound preprocessing looks like in a training script.
_CPU_PATTERNS = (
    (re.compile(r"num_workers\s*=\s*(\d+)"), "DataLoader num_workers={0}"),
    (re.compile(r"torchvision\.transforms|from torchvision import transforms"),
     "torchvision transforms (on the CPU)"),
    (re.compile(r"\bfrom PIL\b|\bimport PIL\b|Image\.open\("), "PIL image decoding"),
    (re.compile(r"\bimport cv2\b|cv2\.imread|cv2\.imdecode"), "OpenCV decoding"),
)
_MAP_CALL = re.compile(r"\.map\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
HIGH_NUM_WORKERS = 4


def cpu_preprocessing(script_text: str) -> list[str]:
    """What in the script preprocesses data on the CPU during training."""
    found = []
    for pattern, label in _CPU_PATTERNS:
        match = pattern.search(script_text)
        if not match:
            continue
        if match.groups():
            if int(match[1]) < HIGH_NUM_WORKERS:
                continue
            label = label.format(match[1])
        found.append(label)
    if "tf.data" in script_text or "Dataset" in script_text:
        for call in _MAP_CALL.finditer(script_text):
            if "num_parallel_calls" not in call[1]:
                found.append("tf.data map without num_parallel_calls")
                break
    return found


def check_preprocessing(job: JobView) -> list[Finding]:
    if not job.dataparallel or not job.script_text:
        return []
    found = cpu_preprocessing(job.script_text)
    if not found:
        return []
    return [Finding(
        "SHOAL-DP007", "warning",
        f"the training script preprocesses data on the CPU ({', '.join(found)}): the "
        "data-parallel library runs AllReduce on the CPU, so this preprocessing competes "
        "with it",
        "move preprocessing to a GPU library (e.g. NVIDIA DALI, torchvision.transforms.v2 on "
        "CUDA tensors) or complete it before training",
        TIP_PREPROCESSING)]


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


# ---------------------------------------------------------------- input regions


@functools.lru_cache(maxsize=1)
def known_regions() -> tuple[str, ...]:
    """Every region botocore's endpoint data knows, longest first (no call is made)."""
    session = botocore.session.get_session()
    names: set[str] = set()
    for partition in session.get_available_partitions():
        names.update(session.get_available_regions("s3", partition_name=partition))
    return tuple(sorted(names, key=len, reverse=True))


def bucket_region_from_name(bucket: str) -> str | None:
    """The region an S3 bucket reference states: an access-point ARN's, or a region name
    standing as a part of the bucket's name (``data-us-west-2``), else None."""
    if bucket.startswith("arn:"):
        parts = bucket.split(":")
        return parts[3] or None if len(parts) > 3 else None
    for region in known_regions():
        if re.search(rf"(^|[-.]){re.escape(region)}($|[-.])", bucket):
            return region
    return None


def _s3_bucket(uri: str) -> str:
    rest = uri[len("s3://"):]
    if rest.startswith("arn:"):
        # s3://arn:aws:s3:region:account:accesspoint/name/key
        return "/".join(rest.split("/")[:2])
    return rest.split("/", 1)[0]


def bucket_region(bucket: str, s3_client=None) -> str | None:
    """The bucket's region from its name, else from GetBucketLocation when a client is given."""
    region = bucket_region_from_name(bucket)
    if region or s3_client is None or bucket.startswith("arn:"):
        return region
    try:
        location = s3_client.get_bucket_location(Bucket=bucket).get("LocationConstraint")
    except botocore.exceptions.ClientError:
        return None
    # the API's legacy answers: none for us-east-1, "EU" for eu-west-1
    return {None: "us-east-1", "": "us-east-1", "EU": "eu-west-1"}.get(location, location)


def subnets_region(subnets, ec2_client) -> str | None:
    """The region of the job's subnets, from their availability zones."""
    if not subnets or ec2_client is None:
        return None
    try:
        described = ec2_client.describe_subnets(SubnetIds=list(subnets))["Subnets"]
    except botocore.exceptions.ClientError:
        return None
    zones = {subnet["AvailabilityZone"] for subnet in described}
    return zones.pop()[:-1] if len(zones) == 1 else None


def check_input_regions(job: JobView, *, s3_client=None, ec2_client=None) -> list[Finding]:
    if not job.region:
        return []
    findings = []
    for name, value in job.inputs.items():
        if isinstance(value, inputs_.TrainingInput) and value.s3_data.startswith("s3://"):
            bucket = _s3_bucket(value.s3_data)
            region = bucket_region(bucket, s3_client)
            if region and region != job.region:
                findings.append(_region_finding("SHOAL-DP003", name, f"S3 bucket {bucket!r}",
                                                region, job.region))
        elif isinstance(value, inputs_.FileSystemInput):
            region = subnets_region(job.config.subnets, ec2_client)
            if region and region != job.region:
                what = f"{value.file_system_type} file system {value.file_system_id!r}"
                findings.append(_region_finding("SHOAL-DP004", name, what, region, job.region))
    return findings


def _region_finding(code: str, channel: str, what: str, region: str, job_region: str) -> Finding:
    return Finding(
        code, "error",
        f"channel {channel!r} reads {what} in {region}, but the job runs in {job_region}",
        f"copy the data to {job_region} or run the job in {region}: input data must be in "
        "the training job's region", TIP_REGION)


# ---------------------------------------------------------------- model-parallel checks


def _mp_parameters(job: JobView):
    if not job.modelparallel:
        return None
    return job.distribution.smdistributed.modelparallel.parameters


def check_microbatches(job: JobView) -> list[Finding]:
    params = _mp_parameters(job)
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
                f"{count} microbatches", _DROP_FIX, TIP_MICROBATCHES))
    if count == 1 or (batch is not None and batch // count < 2) or count > 32:
        findings.append(Finding(
            "SHOAL-MP003", "info",
            f"microbatches is {count}: too few leaves the pipeline idle, too many makes each "
            "microbatch too small to use a GPU",
            "start with 2 or 4 microbatches and the largest batch that fits, then experiment "
            "(see 'shoal plan microbatches')", TIP_MICROBATCHES))
    return findings


_DROP_FIX = ("set drop_last=True in the DataLoader (PyTorch) or drop_remainder=True in "
             "tf.data's batch() (TensorFlow), or skip the last batch by hand")
# ---------------------------------------------------------------- reading the script


def _syntax(text: str | None):
    """The script's syntax tree, None when it is absent or does not parse."""
    if not text:
        return None
    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _called(node: ast.Call) -> str:
    """The dotted name a call calls: ``smp.rank`` for ``smp.rank()``, ``.batch`` for ``x.batch()``."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        owner = func.value.id + "." if isinstance(func.value, ast.Name) else "."
        return owner + func.attr
    return ""


def _calls(tree) -> list[ast.Call]:
    return [node for node in ast.walk(tree) if isinstance(node, ast.Call)]


def _keyword_true(call: ast.Call, name: str) -> bool:
    for keyword in call.keywords:
        if keyword.arg == name:
            value = keyword.value
            return not (isinstance(value, ast.Constant) and not value.value)
        if keyword.arg is None:
            return True  # **kwargs may carry it
    return False


def batches_keeping_the_last(text: str) -> list[str]:
    """DataLoader(...) and tf.data .batch(...) calls that keep the epoch's last, smaller batch."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for call in _calls(tree):
        name = _called(call)
        loader = name.endswith("DataLoader") and not _keyword_true(call, "drop_last")
        batch = name.endswith(".batch") and not _keyword_true(call, "drop_remainder")
        if loader or batch:
            found.append(ast.get_source_segment(text, call) or name)
    return found


def check_drop_last(job: JobView) -> list[Finding]:
    if _mp_parameters(job) is None:
        return []
    missing = batches_keeping_the_last(job.script_text or "")
    if not missing:
        return []
    return [Finding(
        "SHOAL-MP002", "warning",
        f"{', '.join(missing)} keeps the epoch's last, smaller batch, which must also be "
        "divisible by the number of microbatches", _DROP_FIX, TIP_MICROBATCHES)]


_TIED = re.compile(r"tie_weights|tie_word_embeddings|\.weight\s*=\s*[\w.]*\.weight\b")


def check_manual_partition(job: JobView) -> list[Finding]:
    params = _mp_parameters(job)
    if params is None or params.get("auto_partition", True) is not False:
        return []
    tied = bool(job.script_text and _TIED.search(job.script_text))
    what = "the script ties weights" if tied else "modules may share parameters"
    return [Finding(
        "SHOAL-MP004", "warning",
        f"manual partitioning (auto_partition False) and {what} (e.g. a tied embedding "
        "table): modules that share a parameter must be placed on the same device",
        "place modules sharing parameters in the same smp.partition() block, or use "
        "auto_partition: True", TIP_PARTITIONING)]


# Calls that shard or seed data; smp.rank() in their arguments splits a model replica's ranks.
_SHARDING_CALLS = ("shard", "seed", "manual_seed", "set_seed", "DistributedSampler")


def shards_by_rank(text: str) -> list[str]:
    """Sharding or seeding calls whose arguments use ``smp.rank()``."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for call in _calls(tree):
        if _called(call).rsplit(".", 1)[-1] not in _SHARDING_CALLS:
            continue
        arguments = [*call.args, *(k.value for k in call.keywords)]
        if any(_called(inner) == "smp.rank" for arg in arguments for inner in _calls(arg)):
            found.append(ast.get_source_segment(text, call) or _called(call))
    return found


def check_dp_rank(job: JobView) -> list[Finding]:
    if not job.modelparallel:
        return []
    found = shards_by_rank(job.script_text or "")
    if not found:
        return []
    return [Finding(
        "SHOAL-MP005", "warning",
        f"the script shards or seeds its data with smp.rank() ({', '.join(found)}): ranks "
        "of one model replica then see different data",
        "index shards and seed shuffling with smp.dp_rank() (and smp.dp_size())",
        TIP_DATA_PREPARATION)]


def _is_smp_step(decorator) -> tuple[bool, bool]:
    """(is it smp.step, does it name non_split_inputs)."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    is_step = (isinstance(target, ast.Attribute) and target.attr == "step"
               and isinstance(target.value, ast.Name) and target.value.id == "smp")
    return is_step, bool(call and any(k.arg == "non_split_inputs" for k in call.keywords))


def step_functions_without_non_split_inputs(text: str) -> list[tuple[str, list[str]]]:
    """smp.step functions taking more than two tensors and no ``non_split_inputs``."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for decorator in node.decorator_list:
            is_step, named = _is_smp_step(decorator)
            arguments = [a.arg for a in node.args.args if a.arg not in ("self", "model")]
            if is_step and not named and len(arguments) > 2:
                found.append((node.name, arguments))
    return found


def check_step_inputs(job: JobView) -> list[Finding]:
    if not job.modelparallel:
        return []
    return [Finding(
        "SHOAL-MP006", "info",
        f"smp.step function {name}() takes {arguments}: an argument without a batch "
        "dimension would be split into microbatches",
        "list such arguments by name: @smp.step(non_split_inputs=[...])", TIP_STEP)
        for name, arguments in step_functions_without_non_split_inputs(job.script_text or "")]


def forwards_returning_several(text: str) -> list[str]:
    """Classes whose forward() returns a tuple of two or more values."""
    tree = _syntax(text)
    if tree is None:
        return []
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for method in cls.body:
            if not (isinstance(method, ast.FunctionDef) and method.name == "forward"):
                continue
            returns = [n for n in ast.walk(method) if isinstance(n, ast.Return)]
            if any(isinstance(r.value, ast.Tuple) and len(r.value.elts) > 1 for r in returns):
                found.append(cls.name)
    return found


def check_forward_outputs(job: JobView) -> list[Finding]:
    if not job.modelparallel or "DistributedModel" not in (job.script_text or ""):
        return []
    classes = forwards_returning_several(job.script_text)
    if not classes:
        return []
    return [Finding(
        "SHOAL-MP007", "info",
        f"forward() of {classes} returns several tensors: every tensor returned from "
        "smp.DistributedModel is broadcast to all ranks",
        "return only what the training step needs; keep intermediate activations inside "
        "forward()", TIP_RETURNING)]


CHECKS = (
    check_single_host, check_image_cuda, check_storage, check_preprocessing,
    check_batch_scaling, check_mpi_options, check_debugger, check_microbatches,
    check_drop_last, check_manual_partition, check_dp_rank, check_step_inputs,
    check_forward_outputs,
)

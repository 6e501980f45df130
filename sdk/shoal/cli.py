"""The ``shoal`` command line: run a job, follow it, and inspect it by its handle.

``shoal run`` starts a job from flags and/or a YAML job file (see ``shoal.config`` for the keys
and the precedence of configuration layers) and prints the job's handle (``local://job`` or
``sagemaker://region/job``) on stdout; ``status``, ``logs``, ``stop``, ``metrics`` take a handle or a
local job's name; ``list`` shows jobs (``--since``, ``--limit``). Everything except a command's result
goes to stderr.

Exit codes: 0 the job completed, 1 it failed or was stopped, 2 a usage or configuration error,
3 an AWS credentials or permission error, 130 interrupted.
"""

from __future__ import annotations

import json
import sys

import click

from . import config as config_mod
from .errors import ConfigError, ShoalError, exit_code_for
from .frameworks import REMOTE_BACKENDS
from .handles import local_handle, resolve_handle, sagemaker_handle, slurm_handle
from .local.network import NETWORK_MODES

OUTPUT = click.option("--output", "output", type=click.Choice(["text", "json"]), default="text",
                      show_default=True, help="Result format.")


def err(message: str) -> None:
    click.echo(message, err=True)


def emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="shoal")
def cli():
    """Shoal: SageMaker-compatible distributed training, on SageMaker or on this machine."""


# -- run -------------------------------------------------------------------------------------
def _pairs(values, what):
    result = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"expected KEY=VALUE (got {item!r})", param_hint=what)
        result[key] = value
    return result


def _hyperparameters(values):
    # Values are YAML scalars, so --hyperparameter epochs=3 is the int 3, as in a job file.
    import yaml

    return {k: yaml.safe_load(v) if v else v for k, v in _pairs(values, "--hyperparameter").items()}


@cli.command()
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@click.option("--entry-point", help="Training script, relative to --source-dir.")
@click.option("--source-dir", help="Directory with the training code.")
@click.option("--framework", type=click.Choice(config_mod.FRAMEWORKS))
@click.option("--framework-version")
@click.option("--py-version")
@click.option("--image-uri")
@click.option("--role", help="IAM role ARN the job runs as.")
@click.option("--region")
@click.option("--instance-type")
@click.option("--instance-count", type=int)
@click.option("--processes-per-host", type=int,
              help="Training processes per host (default: one per GPU, else 1).")
@click.option("--output-path", help="s3:// or file:// destination of model.tar.gz.")
@click.option("--job-name")
@click.option("--hyperparameter", "-H", "hyperparameter", multiple=True, metavar="KEY=VALUE")
@click.option("--input", "-i", "inputs", multiple=True, metavar="CHANNEL=URI")
@click.option("--env", "-e", "environment", multiple=True, metavar="NAME=VALUE")
@click.option("--allow-secrets", is_flag=True,
              help="Send secret-looking hyperparameter and environment values anyway.")
@click.option("--local", is_flag=True, help="Run on this machine (instance type 'local').")
@click.option("--backend", type=click.Choice(REMOTE_BACKENDS),
              help="Where a non-local job runs (default: SageMaker, or $SHOAL_BACKEND).")
@click.option("--network", "local_network", type=click.Choice(NETWORK_MODES),
              help="Local jobs: hosts on loopback, or in network namespaces of their own (root).")
@click.option("--link", "local_link", metavar="SPEC",
              help="Local jobs in namespaces: an emulated link, e.g. rate=10gbit,delay=50us.")
@click.option("--dry-run", is_flag=True, help="Print the request (secrets redacted); call nothing.")
@click.option("--detach", is_flag=True, help="Print the handle and return; do not follow.")
def run(job_file, local, dry_run, detach, hyperparameter, inputs, environment, **flags):
    """Run a training job from flags and/or JOB_FILE (YAML)."""
    flags["allow_secrets"] = flags["allow_secrets"] or None  # unset: the job file decides
    flags["hyperparameters"] = _hyperparameters(hyperparameter) or None
    flags["inputs"] = _pairs(inputs, "--input") or None
    flags["environment"] = _pairs(environment, "--env") or None
    if local:
        flags["instance_type"] = "local"
    spec = config_mod.resolve(job_file, flags)
    session = (dry_run_session(spec) if dry_run and not (spec.is_local or spec.on_slurm)
               else None)
    estimator = config_mod.build_estimator(spec, sagemaker_session=session)
    if dry_run:
        emit_json(dry_run_request(estimator, spec))
        return
    if spec.is_local:
        import os

        os.environ.update(config_mod.local_environment(spec))  # the supervisor inherits them
    estimator.fit(spec.inputs, wait=False, job_name=spec.job_name)
    job = estimator.latest_training_job
    if spec.is_local:
        handle = local_handle(job.name)
    elif spec.on_slurm:
        handle = slurm_handle(job.name)
    else:
        handle = sagemaker_handle(estimator.sagemaker_session.boto_region_name, job.name)
    click.echo(str(handle))
    sys.stdout.flush()
    if detach:
        err(f"detached; follow with: shoal logs {handle}")
        return
    follow(job, handle)


class _AccountFromRole:
    """Stands in for STS in a dry run: the account is read from the role ARN, not asked for."""

    def __init__(self, account: str):
        self.account = account

    def get_caller_identity(self):
        return {"Account": self.account}


def dry_run_session(spec):
    """A session that can build the request (image URI, default bucket) without any call."""
    import boto3

    from .session import Session

    parts = (spec.role or "").split(":")
    if len(parts) < 6 or not parts[4].isdigit():
        raise ConfigError("--dry-run needs 'role' as an IAM role ARN: its account names the "
                          "image and the default bucket without calling AWS")
    return Session(boto_session=boto3.Session(region_name=spec.region),
                   sts_client=_AccountFromRole(parts[4]))


def dry_run_request(estimator, spec) -> dict:
    """The request ``fit()`` would submit, secrets redacted, built without any call."""
    from .secrets import redact
    from .staging import check_code_paths

    check_code_paths(estimator.config.entry_point, estimator.config.source_dir)  # as fit() does
    job_name = estimator._prepare_for_training(spec.job_name)
    return redact(estimator.build_request(spec.inputs, job_name))


def follow(job, handle) -> None:
    """Follow ``job`` to its end, its log on stderr; exit 1 unless it completed."""
    job.wait(logs="All", out=sys.stderr)
    status = job.describe()["TrainingJobStatus"]
    if status != "Completed":
        err(f"job {handle} ended {status}")
        sys.exit(1)
    model = job.model_data
    if model:
        err(f"model artifacts: {model}")


# -- read verbs ------------------------------------------------------------------------------
def open_job(text: str):
    """The TrainingJob object behind a handle (or a local job's bare name)."""
    handle = resolve_handle(text)
    if handle.is_local:
        from .backends.local import LocalTrainingJob

        return handle, LocalTrainingJob.attach(handle.job_name)
    if handle.is_slurm:
        from .backends.slurm import SlurmTrainingJob

        return handle, SlurmTrainingJob.attach(handle.job_name, slurm_settings().shared_dir)
    return handle, sagemaker_job(handle)


def slurm_settings():
    """The Slurm cluster's settings: the configuration files' ``slurm:`` section, else the
    environment (SHOAL_SLURM_SHARED_DIR ...)."""
    from .slurm.settings import SlurmSettings

    return SlurmSettings.resolve(config_mod.resolve().slurm)


def sagemaker_session(region: str):
    import boto3

    from .session import Session

    return Session(boto_session=boto3.Session(region_name=region))


def sagemaker_job(handle):
    """The SageMaker job behind a handle."""
    from .backends.sagemaker import backend

    return backend(sagemaker_session(handle.region)).job(handle.job_name)


def summary(description: dict) -> dict:
    keys = ("TrainingJobName", "TrainingJobStatus", "SecondaryStatus", "FailureReason",
            "CreationTime", "TrainingStartTime", "TrainingEndTime")
    result = {k: description[k] for k in keys if k in description}
    model = description.get("ModelArtifacts", {}).get("S3ModelArtifacts")
    if model:
        result["ModelArtifacts"] = model
    if description.get("ProfilingStatus"):
        result["ProfilingStatus"] = description["ProfilingStatus"]
    for metric in description.get("FinalMetricDataList") or ():  # the last value of each
        result[f"Metric {metric['MetricName']}"] = f"{metric['Value']:g} (at {metric['Timestamp']})"
    # Debugger's rules, as the SDK prints them while following a job: "<rule>: <status>"
    for key in ("DebugRuleEvaluationStatuses", "ProfilerRuleEvaluationStatuses"):
        for rule in description.get(key) or ():
            details = (rule.get("StatusDetails") or "").replace("\n", "; ")  # a finding a line
            status = rule.get("RuleEvaluationStatus", "")
            result[f"Rule {rule.get('RuleConfigurationName')}"] = (
                f"{status} ({details})" if details else status)
    return result


@cli.command()
@click.argument("handle")
@OUTPUT
def status(handle, output):
    """Show a job's status (exit 0 completed or running, 1 failed or stopped)."""
    handle, job = open_job(handle)
    description = job.describe()
    if output == "json":
        emit_json(description)
    else:
        for key, value in summary(description).items():
            click.echo(f"{key}: {value}")
    if description["TrainingJobStatus"] in ("Failed", "Stopped"):
        sys.exit(1)


@cli.command()
@click.argument("handle")
@click.option("--follow/--no-follow", "-f", default=False, help="Keep printing until the job ends.")
def logs(handle, follow):
    """Print a job's log."""
    handle, job = open_job(handle)
    job.logs(wait=follow, out=sys.stdout)


@cli.command()
@click.argument("handle")
@click.option("--wait", is_flag=True, help="Return once the job has stopped.")
def stop(handle, wait):
    """Stop a running job."""
    handle, job = open_job(handle)
    if handle.is_local or handle.is_slurm:
        job.stop(wait=wait)
    else:
        job.stop()
    err(f"stop requested for {handle}")


@cli.command(name="list")
@click.option("--sagemaker", "region", metavar="REGION", help="List SageMaker jobs in REGION.")
@click.option("--slurm", "on_slurm", is_flag=True,
              help="List the Slurm cluster's jobs (those under its shared directory).")
@click.option("--since", metavar="WHEN",
              help="Only jobs created since WHEN: a duration back from now (30m, 1h, 2d, 1w) "
                   "or a date or time (2026-11-01, 2026-11-01T14:00; local time unless it "
                   "says otherwise).")
@click.option("--limit", "-n", "--max-results", "limit", type=click.IntRange(min=1), default=20,
              metavar="N", show_default=True, help="At most N jobs, the newest.")
@OUTPUT
def list_jobs(region, on_slurm, since, limit, output):
    """List local jobs (SageMaker jobs with --sagemaker REGION, the Slurm cluster's with
    --slurm), newest first: handle, status, creation time and duration (until now for a
    running job)."""
    cutoff = since_cutoff(since) if since else None
    if region:
        rows = sagemaker_jobs(region, limit, cutoff)
    elif on_slurm:
        rows = local_jobs(cutoff, slurm_settings().shared_dir, slurm_handle)
    else:
        rows = local_jobs(cutoff)
    rows = rows[:limit]
    if output == "json":
        emit_json(rows)
        return
    for line in job_table(rows, now()):
        click.echo(line)


def now():
    import datetime as dt

    return dt.datetime.now(dt.timezone.utc)


_SPANS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def since_cutoff(text: str, at=None):
    """The creation time ``--since`` means: ``at`` (now) less a duration such as ``90m``,
    or a date or time in ISO 8601 (the local time zone unless one is given)."""
    import datetime as dt
    import re

    at = at or now()
    span = re.fullmatch(r"(\d+)\s*([smhdw])", text.strip().lower())
    if span:
        return at - dt.timedelta(seconds=int(span[1]) * _SPANS[span[2]])
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise click.BadParameter(f"expected a duration such as 30m, 1h, 2d, 1w or a date such "
                                 f"as 2026-11-01 (got {text!r})", param_hint="'--since'") from None
    return when if when.tzinfo else when.astimezone()  # naive: the local time zone


def duration(seconds: float) -> str:
    """``45s``, ``3m05s``, ``2h07m``, ``3d04h``: the two largest units."""
    seconds = max(0, int(seconds))
    for unit, small, name, small_name in ((86400, 3600, "d", "h"), (3600, 60, "h", "m"),
                                          (60, 1, "m", "s")):
        if seconds >= unit:
            return f"{seconds // unit}{name}{seconds % unit // small:02d}{small_name}"
    return f"{seconds}s"


def job_table(rows: list[dict], at) -> list[str]:
    """``shoal list``'s lines: a header, then one aligned row per job."""
    table = [("HANDLE", "STATUS", "CREATED", "DURATION")]
    for row in rows:
        created = row["CreationTime"]
        end = row.get("TrainingEndTime") or at
        table.append((row["Handle"], row["TrainingJobStatus"],
                      created.astimezone().strftime("%Y-%m-%d %H:%M:%S"),
                      duration((end - created).total_seconds())))
    widths = [max(len(cells[i]) for cells in table) for i in range(3)]
    return ["  ".join([*(c.ljust(w) for c, w in zip(cells, widths)), cells[3]])
            for cells in table]


def local_jobs(cutoff=None, root=None, handle=local_handle) -> list[dict]:
    """The jobs recorded under ``root`` (the local root; a Slurm cluster's shared directory
    with ``handle=slurm_handle``), newest first."""
    from .local import layout, state

    rows = []
    root = root or layout.local_root()
    for path in root.glob("*/job.json") if root.exists() else []:
        record = state.read(path)
        if cutoff and record["CreationTime"] < cutoff:
            continue
        rows.append({"Handle": str(handle(record["TrainingJobName"])),
                     "TrainingJobStatus": record["TrainingJobStatus"],
                     "CreationTime": record["CreationTime"],
                     **_end_time(record)})
    return sorted(rows, key=lambda row: row["CreationTime"], reverse=True)


def _end_time(record: dict) -> dict:
    return {"TrainingEndTime": record["TrainingEndTime"]} if record.get("TrainingEndTime") else {}


def sagemaker_jobs(region: str, max_results: int, cutoff=None) -> list[dict]:
    client = sagemaker_session(region).sagemaker_client
    since = {"CreationTimeAfter": cutoff} if cutoff else {}
    response = client.list_training_jobs(MaxResults=min(max_results, 100), SortBy="CreationTime",
                                         SortOrder="Descending", **since)
    return [{"Handle": str(sagemaker_handle(region, job["TrainingJobName"])),
             "TrainingJobStatus": job["TrainingJobStatus"], "CreationTime": job["CreationTime"],
             **_end_time(job)}
            for job in response["TrainingJobSummaries"]]


# -- config and env --------------------------------------------------------------------------
@cli.group(name="config")
def config_group():
    """Create or show Shoal's configuration files."""


CONFIG_TEMPLATE = """\
# Shoal configuration: defaults for every job (same keys as a job file).
# Precedence: flags > job file > $SHOAL_CONFIG > ~/.config/shoal/config.yaml > ./shoal.yaml
# role: arn:aws:iam::111122223333:role/SageMakerRole
# region: us-west-2
# output_path: s3://my-bucket/shoal
# instance_type: ml.p4d.24xlarge
# framework: pytorch
"""


@config_group.command(name="init")
@click.option("--project", is_flag=True, help="Write ./shoal.yaml instead of the user config.")
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def config_init(project, force):
    """Write a commented configuration file."""
    from pathlib import Path

    path = Path("shoal.yaml") if project else config_mod.user_config_path()
    if path.exists() and not force:
        raise ConfigError(f"{path} exists (use --force to overwrite)")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CONFIG_TEMPLATE)
    click.echo(str(path))


@config_group.command(name="show")
@click.argument("job_file", required=False, type=click.Path(dir_okay=False))
@OUTPUT
def config_show(job_file, output):
    """Show the effective configuration and which layer each key comes from."""
    layers = [(name, config_mod.load_spec(path)) for name, path in config_mod.config_layers()]
    if job_file:
        layers.append((job_file, config_mod.load_spec(job_file)))
    origin, merged = {}, {}
    for name, spec in layers:
        for key, value in spec.to_dict().items():
            origin[key], merged[key] = name, value
    if output == "json":
        emit_json({k: {"value": merged[k], "from": origin[k]} for k in merged})
        return
    for key in merged:
        click.echo(f"{key}: {json.dumps(merged[key], default=str)}  # {origin[key]}")


@cli.command()
@OUTPUT
def env(output):
    """Versions for bug reports (no credentials, no environment variables)."""
    report = environment_report()
    if output == "json":
        emit_json(report)
    else:
        for key, value in report.items():
            click.echo(f"{key}: {value}")


def _version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


def _open_mpi_version() -> str:
    import subprocess

    try:
        out = subprocess.run(["mpirun", "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "not found"
    return (out.stdout.splitlines() or ["unknown"])[0]


def environment_report() -> dict:
    """Versions only: nothing from the environment or the AWS configuration."""
    import platform

    from . import __version__

    return {
        "shoal": __version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": _version("torch"),
        "tensorflow": _version("tensorflow-cpu") if _version("tensorflow") == "not installed"
        else _version("tensorflow"),
        "open_mpi": _open_mpi_version(),
        "mpi4py": _version("mpi4py"),
        "boto3": _version("boto3"),
        "botocore": _version("botocore"),
        "sagemaker": _version("sagemaker"),
    }


def _mount_image_commands() -> None:
    try:
        from .image_commands import image
    except ImportError:
        return
    cli.add_command(image, name="image")


_mount_image_commands()


def _mount_advice_commands() -> None:
    from .advice_commands import advise, plan

    cli.add_command(advise, name="advise")
    cli.add_command(plan, name="plan")
    from .strategy_commands import strategy

    plan.add_command(strategy, name="strategy")


_mount_advice_commands()


def _mount_report_command() -> None:
    from .debugger.report_command import report

    cli.add_command(report, name="report")


_mount_report_command()


def _mount_serve_command() -> None:
    from .server.command import serve

    cli.add_command(serve, name="serve")


_mount_serve_command()


def _mount_metrics_command() -> None:
    from .metrics_command import metrics

    cli.add_command(metrics, name="metrics")


_mount_metrics_command()


def _mount_endpoint_commands() -> None:
    from .endpoint_commands import endpoints, invoke

    cli.add_command(endpoints, name="endpoints")
    cli.add_command(invoke, name="invoke")


_mount_endpoint_commands()


def main(argv=None) -> int:
    """Console entry point: run the CLI and turn errors into exit codes."""
    try:
        cli.main(args=argv, prog_name="shoal", standalone_mode=False)
    except click.exceptions.Exit as done:
        return done.exit_code
    except click.Abort:
        err("interrupted")
        return 130
    except click.ClickException as error:
        error.show()
        return 2
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else 1
    except KeyboardInterrupt as error:
        err("interrupted")
        return exit_code_for(error)
    except ShoalError as error:
        err(f"error: {error}")
        return exit_code_for(error)
    except Exception as error:
        mapped = _aws_error(error)
        if mapped is not None:
            err(f"error: {mapped}")
            return exit_code_for(mapped)
        if _is_botocore_error(error):  # network and client-side failures: no traceback
            err(f"error: {error}")
            return 1
        raise
    return 0


def _is_botocore_error(error: Exception) -> bool:
    import botocore.exceptions

    return isinstance(error, (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError))


def _aws_error(error: Exception):
    try:
        from .aws_errors import translate
    except ImportError:
        return None
    return translate(error)


if __name__ == "__main__":
    sys.exit(main())

"""``shoal report HANDLE``: a job's profiler report (``profiler-report.html``).

``local://<job>`` reads the local job's profiler data and rule reports; ``sagemaker://<region>/
<job>`` downloads them first (the profiler's ``<S3OutputPath>/<job>/profiler-output/`` and the
job's ``<output>/<job>/rule-output/``, with the owner check on the bucket); a directory laid
out as ``<output>/<job>/`` works too. The page is written to ``--out`` (default
``<job>-profiler-report.html``), its path printed on stdout, and ``--open`` shows it in the
default browser. Nothing in the page reaches the network.
"""

from __future__ import annotations

import tempfile
import webbrowser
from pathlib import Path

import click

from shoal.errors import ValidationError

__all__ = ["report"]


def _local_job_dir(name: str) -> Path:
    from shoal.local import layout

    paths = layout.JobPaths.for_job(name)
    if not paths.state_file.exists():
        raise ValidationError(f"no local job {name!r} under {paths.job_dir.parent}")
    return paths.job_dir


def _download_prefix(s3, uri: str, target: Path, owner: str) -> int:
    bucket, _, prefix = uri[len("s3://"):].partition("/")
    prefix = prefix.rstrip("/") + "/"
    count = 0
    for page in s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=prefix, ExpectedBucketOwner=owner):
        for item in page.get("Contents", []):
            rel = item["Key"][len(prefix):]
            path = (target / rel).resolve()
            if not rel or target.resolve() not in path.parents:
                continue  # a key that would land outside the folder
            path.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(bucket, item["Key"], str(path),
                             ExtraArgs={"ExpectedBucketOwner": owner})
            count += 1
    return count


def _sagemaker_job_dir(handle, into: Path) -> Path:
    from shoal.cli import sagemaker_job, sagemaker_session

    description = sagemaker_job(handle).describe()
    session = sagemaker_session(handle.region)
    name = description["TrainingJobName"]
    profiler = (description.get("ProfilerConfig") or {}).get("S3OutputPath")
    output = description["OutputDataConfig"]["S3OutputPath"]
    job_dir = into / name
    owner = session.account_id()
    if profiler:
        _download_prefix(session.s3_client, f"{profiler.rstrip('/')}/{name}/profiler-output",
                         job_dir / "profiler-output", owner)
    _download_prefix(session.s3_client, f"{output.rstrip('/')}/{name}/rule-output",
                     job_dir / "rule-output", owner)
    return job_dir


@click.command()
@click.argument("handle")
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the page (default: <job>-profiler-report.html).")
@click.option("--open", "open_it", is_flag=True, help="Show it in the default browser.")
def report(handle, out, open_it):
    """Write a job's profiler report (local://JOB or a local job's name,
    sagemaker://REGION/JOB, or a job folder)."""
    from shoal.handles import resolve_handle
    from shoal.local import metrics
    from shoal.profiler import report as page

    with tempfile.TemporaryDirectory(prefix="shoal-report-") as tmp:
        if Path(handle).is_dir():
            job_dir = Path(handle)
        else:
            parsed = resolve_handle(handle)
            job_dir = (_local_job_dir(parsed.job_name) if parsed.is_local
                       else _sagemaker_job_dir(parsed, Path(tmp)))
        data, rule_dirs = page.job_folders(job_dir)
        if not data.exists() and not rule_dirs:
            raise ValidationError(f"{handle}: no profiler data or rule reports (was the "
                                  "profiler disabled?)")
        job = job_dir.name
        target = out or Path(f"{job}-profiler-report.html")
        # each rule's status from its own report; a local job's metrics join the plots
        page.write(target, job, data, rule_dirs, metrics=metrics.timeline(job_dir))
    click.echo(str(target.resolve()))
    if open_it:
        webbrowser.open(target.resolve().as_uri())

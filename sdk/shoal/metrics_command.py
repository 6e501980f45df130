"""``shoal metrics HANDLE``: a job's training metrics (its MetricDefinitions' values) over time.

A local job's datapoints are read from its own folder (every value, with the host that printed
it); a SageMaker job's come from CloudWatch (``/aws/sagemaker/TrainingJobs``, dimension
``TrainingJobName``; one-minute averages, as SDK v2's ``TrainingJobAnalytics`` reads them).
Text is a rich table, ``--output json`` the series as JSON, ``--plot out.png`` one panel per
metric (matplotlib's Agg backend: no display needed), the PNG's path printed on stdout.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from shoal.errors import ConfigError

__all__ = ["metrics"]

PERIOD = 60  # CloudWatch's period for SageMaker jobs, as TrainingJobAnalytics uses


def local_series(job) -> dict[str, list[dict]]:
    from shoal.local import metrics as local_metrics

    return {name: [{"Timestamp": p.time, "Value": p.value, "Host": p.host} for p in points]
            for name, points in local_metrics.by_metric(local_metrics.read(job.paths.job_dir)).items()}


def cloudwatch_series(cloudwatch, description: dict) -> dict[str, list[dict]]:
    start = description.get("TrainingStartTime")
    if start is None:
        return {}
    end = description.get("TrainingEndTime") or dt.datetime.now(dt.timezone.utc)
    series = {}
    for definition in description.get("AlgorithmSpecification", {}).get("MetricDefinitions") or []:
        points = cloudwatch.get_metric_statistics(
            Namespace="/aws/sagemaker/TrainingJobs", MetricName=definition["Name"],
            Dimensions=[{"Name": "TrainingJobName", "Value": description["TrainingJobName"]}],
            StartTime=start, EndTime=end + dt.timedelta(minutes=1), Period=PERIOD,
            Statistics=["Average"])["Datapoints"]
        if points:
            series[definition["Name"]] = [{"Timestamp": p["Timestamp"], "Value": p["Average"]}
                                          for p in sorted(points, key=lambda p: p["Timestamp"])]
    return series


def job_series(text: str) -> tuple[str, dict[str, list[dict]]]:
    from shoal.cli import open_job, sagemaker_session

    handle, job = open_job(text)
    if handle.is_local:
        return handle.job_name, local_series(job)
    session = sagemaker_session(handle.region)
    return handle.job_name, cloudwatch_series(session.boto_session.client("cloudwatch"),
                                              job.describe())


def print_table(job_name: str, series: dict[str, list[dict]]) -> None:
    from shoal.advice_commands import _table

    rows = [(name, p["Timestamp"].isoformat(timespec="milliseconds"),
             f"{(p['Timestamp'] - points[0]['Timestamp']).total_seconds():.1f}",
             f"{p['Value']:g}", p.get("Host", ""))
            for name, points in series.items() for p in points]
    _table(f"metrics of {job_name}", ["metric", "time (UTC)", "seconds", "value", "host"], rows)


def plot(job_name: str, series: dict[str, list[dict]], target: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only: never a window, works without a display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(series), 1, figsize=(8, 3 * len(series)), squeeze=False)
    origin = min(p["Timestamp"] for points in series.values() for p in points)
    for axis, (name, points) in zip(axes[:, 0], series.items()):
        axis.plot([(p["Timestamp"] - origin).total_seconds() for p in points],
                  [p["Value"] for p in points], marker=".")
        axis.set_ylabel(name)
        axis.grid(True, alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the first datapoint")
    axes[0, 0].set_title(job_name)
    figure.tight_layout()
    figure.savefig(target, format="png")
    plt.close(figure)
    return target


@click.command()
@click.argument("handle")
@click.option("--plot", "plot_to", type=click.Path(dir_okay=False, path_type=Path),
              help="Write a PNG with one panel per metric instead of printing a table.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="Result format.")
def metrics(handle, plot_to, output):
    """Show a job's training metrics (its metric definitions' values) over time."""
    job_name, series = job_series(handle)
    if not series:
        if plot_to is not None:
            raise ConfigError(f"job {job_name!r} has no metric datapoints to plot")
        click.echo(f"no metric datapoints for {job_name} (none of its metric definitions "
                   f"matched its output yet)", err=True)
    if plot_to is not None:
        click.echo(str(plot(job_name, series, plot_to)))
    elif output == "json":
        from shoal.cli import emit_json

        emit_json({"TrainingJobName": job_name, "Metrics": series})
    elif series:
        print_table(job_name, series)

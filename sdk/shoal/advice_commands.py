"""``shoal advise`` and ``shoal plan``: the advisor and the planner on the command line.

``shoal advise job.yaml [--script train.py]`` prints the advisor's findings for a job file
(exit 0; with ``--strict``, 2 when any finding is an error). ``shoal plan fsx|lr|microbatches|
topology`` prints the planner's tables (rich) or, with ``--output json``, JSON.
"""

from __future__ import annotations

import io
import json
import sys

import attrs
import click

from shoal import config as config_mod
from shoal.planning import advisor, sizing

__all__ = ["advise", "plan"]

OUTPUT = click.option("--output", "output", type=click.Choice(["text", "json"]), default="text",
                      show_default=True, help="Result format.")
STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _emit_json(data) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _console():
    """A rich console whose text goes out through click (so CliRunner and pipes see it)."""
    from rich.console import Console

    return Console(file=io.StringIO(), width=120, highlight=False,
                   force_terminal=sys.stdout.isatty())


def _flush(console) -> None:
    click.echo(console.file.getvalue(), nl=False)


def _table(title: str, columns, rows) -> None:
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    console = _console()
    console.print(table)
    _flush(console)


@click.command()
@click.argument("job_file", type=click.Path(dir_okay=False))
@click.option("--script", type=click.Path(exists=True, dir_okay=False),
              help="Training script to check (default: the job's entry point, when local).")
@click.option("--dataset-gb", type=float, help="Data set size, to size FSx for Lustre.")
@click.option("--epoch-seconds", type=float, help="Expected time of one epoch.")
@click.option("--dataset-size", type=int, help="Samples per epoch (last-batch check).")
@click.option("--strict", is_flag=True, help="Exit 2 when any finding is an error.")
@OUTPUT
def advise(job_file, script, dataset_gb, epoch_seconds, dataset_size, strict, output):
    """Check JOB_FILE against the distributed training tips and pitfalls."""
    spec = config_mod.resolve(job_file)
    estimator = advisor.estimator_for_spec(spec)
    if script:
        with open(script, encoding="utf-8", errors="replace") as handle:
            text = handle.read(advisor.MAX_SCRIPT_BYTES)
    else:
        text = advisor.read_script(estimator.config)
    findings = advisor.advise(estimator, spec.inputs, region=spec.region, script_text=text,
                              dataset_gb=dataset_gb, epoch_seconds=epoch_seconds,
                              dataset_size=dataset_size)
    if output == "json":
        _emit_json([finding.to_dict() for finding in findings])
    else:
        _print_findings(findings)
    if strict and any(finding.severity == "error" for finding in findings):
        sys.exit(2)


def _print_findings(findings) -> None:
    if not findings:
        click.echo("no findings")
        return
    from rich.markup import escape

    console = _console()
    for f in findings:
        console.print(f"[{STYLE[f.severity]}]{f.code} {f.severity}[/]: {escape(f.message)}")
        console.print(f"  fix: {f.fix}", markup=False)
        console.print(f"  tip: {f.source}", markup=False)
    _flush(console)


# -- plan ------------------------------------------------------------------------------------
@click.group()
def plan():
    """Size storage, scale the learning rate, pick microbatches, lay out ranks."""


@plan.command()
@click.option("--dataset-gb", type=float, required=True, help="Data set size in GB.")
@click.option("--epoch-seconds", type=float, required=True, help="Time of one epoch.")
@click.option("--instance-count", type=int, default=1, show_default=True)
@click.option("--deployment-type", type=click.Choice(
    sorted({t.name for t in sizing.DEPLOYMENT_TYPES})), help="Only this deployment type.")
@OUTPUT
def fsx(dataset_gb, epoch_seconds, instance_count, deployment_type, output):
    """FSx for Lustre capacity reaching dataset / epoch time."""
    result = sizing.plan_fsx(dataset_gb, epoch_seconds, instance_count, deployment_type)
    if output == "json":
        data = attrs.asdict(result)
        data.update(required_mbps=result.required_mbps, per_instance_mbps=result.per_instance_mbps)
        _emit_json(data)
        return
    click.echo(f"required throughput: {result.required_mbps:.0f} MB/s "
               f"({result.per_instance_mbps:.0f} MB/s per instance x {instance_count})")
    rows = [(o.deployment_type, o.per_unit_throughput, f"{o.storage_gib / 1000:.1f}",
             f"{o.throughput_mbps:.0f}", f"{o.minimum_storage_gib / 1000:.1f}",
             f"{o.minimum_throughput_mbps:.0f}") for o in result.options]
    _table("FSx for Lustre", ["deployment type", "MB/s/TiB", "storage TiB", "MB/s",
                              "minimum TiB", "minimum MB/s"], rows)
    click.echo(f"note: {result.note}")


@plan.command()
@click.option("--base-lr", type=float, required=True, help="Learning rate tuned for --base-batch.")
@click.option("--base-batch", type=int, required=True)
@click.option("--global-batch", type=int, help="New global batch (default: batch x processes).")
@click.option("--processes", type=int, help="Processes (GPUs) in the job, for the global batch.")
@click.option("--warmup-steps", type=int, default=0, show_default=True)
@OUTPUT
def lr(base_lr, base_batch, global_batch, processes, warmup_steps, output):
    """Linear scaling rule with a gradual warm-up."""
    if global_batch is None:
        if processes is None:
            raise click.UsageError("give --global-batch or --processes")
        global_batch = base_batch * processes
    result = sizing.scale_learning_rate(base_lr, base_batch, global_batch, warmup_steps)
    schedule = sizing.warmup_schedule(result)
    if output == "json":
        _emit_json({**attrs.asdict(result), "factor": result.factor,
                    "scaled_lr": result.scaled_lr, "warmup_schedule": schedule})
        return
    click.echo(f"global batch {global_batch} = {result.factor:g} x {base_batch}: "
               f"learning rate {base_lr:g} -> {result.scaled_lr:g}")
    if warmup_steps:
        _table("warm-up", ["step", "learning rate"],
               [(step, f"{value:.6g}") for step, value in enumerate(schedule)])


@plan.command()
@click.option("--batch-size", type=int, required=True)
@click.option("--candidates", default="1,2,4,8,16,32", show_default=True,
              help="Comma-separated microbatch counts to consider.")
@click.option("--dataset-size", type=int, help="Samples per epoch (last-batch check).")
@OUTPUT
def microbatches(batch_size, candidates, dataset_size, output):
    """Microbatch counts that divide the batch size."""
    try:
        counts = tuple(int(c) for c in candidates.split(",") if c.strip())
    except ValueError as error:
        raise click.BadParameter(f"expected comma-separated ints (got {candidates!r})",
                                 param_hint="--candidates") from error
    result = sizing.plan_microbatches(batch_size, counts, dataset_size)
    if output == "json":
        _emit_json({**attrs.asdict(result), "last_batch": result.last_batch})
        return
    rows = [(o.microbatches, o.microbatch_size, "yes" if o.drop_last else "no",
             "start here" if o.recommended else "") for o in result.options]
    _table(f"microbatches for batch size {batch_size}",
           ["microbatches", "microbatch size", "drop last batch", ""], rows)
    if result.rejected:
        click.echo(f"not dividing {batch_size}: {', '.join(map(str, result.rejected))}")


@plan.command()
@click.option("--instance-type", required=True)
@click.option("--instance-count", type=int, required=True)
@click.option("--processes-per-host", type=int, help="Default: GPUs per instance.")
@click.option("--allreduce-mb", type=float, default=100.0, show_default=True,
              help="Size of one AllReduce (e.g. the gradients), in MB.")
@OUTPUT
def topology(instance_type, instance_count, processes_per_host, allreduce_mb, output):
    """Ranks per host and AllReduce traffic: flat ring vs hierarchical."""
    result = sizing.plan_topology(instance_type, instance_count, processes_per_host)
    traffic = result.allreduce(int(allreduce_mb * 10**6))
    if output == "json":
        _emit_json({**attrs.asdict(result), "world_size": result.world_size,
                    "allreduce": attrs.asdict(traffic)})
        return
    click.echo(f"{result.hosts} hosts x {result.local_size} ranks = {result.world_size} ranks "
               f"({instance_type})")
    mb = 10**6
    rows = [
        ("flat ring", f"{traffic.ring_bytes_per_rank / mb:.1f}",
         f"{traffic.ring_network_bytes_per_host / mb:.1f}", 1 if result.hosts > 1 else 0),
        ("hierarchical", f"{traffic.intra_host_bytes_per_rank / mb:.1f} in host + "
         f"{traffic.inter_host_bytes_per_rank / mb:.1f} between hosts",
         f"{traffic.inter_host_bytes_per_rank / mb:.1f} per stream",
         traffic.network_streams_per_host),
    ]
    _table(f"one AllReduce of {allreduce_mb:g} MB",
           ["scheme", "MB sent per rank", "MB on the network", "network streams per host"],
           rows)

"""``shoal plan strategy``: the strategy planner on the command line.

Prints the chosen configuration, its predicted memory and step time term by term, and the
runners-up with the reason each lost (rich), or with ``--output json`` one JSON object: the
:class:`~shoal.planning.strategy.StrategyPlan`. An impossible input exits 2 with its fix.
"""

from __future__ import annotations

import json

import click

MODEL_HELP = ("transformer:layers=24,hidden=2304,heads=24,seq=2048,vocab=51200[,ffn=..,"
              "kv_heads=..,tied=..,gated=..,flash=..] or file.py:factory (an nn.Module, traced "
              "on the meta device with --sample-input-shape)")


def _pins(values) -> dict:
    from shoal.planning.strategy import PINS

    pins = {}
    for item in values:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in PINS:
            raise click.BadParameter(f"expected KEY=VALUE with KEY one of {', '.join(PINS)} "
                                     f"(got {item!r})", param_hint="--pin")
        text = value.strip().lower()
        if key in ("checkpointing", "optimizer_sharding"):
            if text not in ("true", "false", "1", "0", "on", "off"):
                raise click.BadParameter(f"{key} takes true or false (got {value!r})",
                                         param_hint="--pin")
            pins[key] = text in ("true", "1", "on")
            continue
        try:
            pins[key] = int(text)
        except ValueError:
            raise click.BadParameter(f"{key} takes an int (got {value!r})",
                                     param_hint="--pin") from None
    return pins


def _model(model: str, sample_input_shape: str | None, measure_blocks: bool = False):
    if ".py:" not in model:  # a description (parse_description says what is wrong)
        return model
    if not sample_input_shape:
        raise click.UsageError("a model factory needs --sample-input-shape (batch first, "
                               "for example 8,3,224,224)")
    from shoal.planning.tracing import profile_factory

    try:
        shape = tuple(int(d) for d in sample_input_shape.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated ints (got {sample_input_shape!r})",
                                 param_hint="--sample-input-shape") from None
    return profile_factory(model, shape, measure_blocks=measure_blocks)


def _calibration(path, calibrate: bool, instance_type, instance_count, processes_per_host,
                 role, out, precision="fp32"):
    from shoal.planning import calibrate as calibrate_

    if path and calibrate:
        raise click.UsageError("give --calibration FILE or --calibrate, not both")
    if path:
        return calibrate_.read(path)
    if not calibrate:
        return None
    from shoal.planning import instances

    per_host = processes_per_host or instances.gpus_per_instance(instance_type) or 1
    if not role and instance_type not in instances.LOCAL_INSTANCE_TYPES:
        raise click.UsageError("--calibrate on SageMaker needs --role (the job's IAM role)")
    estimator = calibrate_.probe_estimator(
        instance_type, instance_count, per_host,
        role=role or "arn:aws:iam::111122223333:role/ShoalLocal", precision=precision)
    click.echo(f"calibrating: a {instance_count} x {instance_type} job, {per_host} processes "
               "per host", err=True)
    measured = calibrate_.run(estimator)
    if out:
        import attrs

        with open(out, "w", encoding="utf-8") as handle:
            json.dump({"calibration": {k: v for k, v in attrs.asdict(measured).items()
                                       if v is not None}}, handle, indent=2)
    return measured


@click.command()
@click.option("--model", required=True, help=MODEL_HELP)
@click.option("--sample-input-shape", help="Sample input shape for a model factory, batch first.")
@click.option("--measure-blocks", is_flag=True,
              help="Time one block of a factory's model on this machine against a matmul.")
@click.option("--global-batch", type=int, required=True, help="Samples per optimizer step.")
@click.option("--instance-type", required=True)
@click.option("--instance-count", type=int, default=1, show_default=True)
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32",
              show_default=True)
@click.option("--optimizer", default="adam", show_default=True,
              help="adam, adamw, lamb, sgd, sgd_momentum, adagrad, rmsprop, adafactor.")
@click.option("--sequence-length", type=int, help="Overrides the description's seq.")
@click.option("--pin", "pins", multiple=True, metavar="KEY=VALUE",
              help="Fix a degree: data, pipeline, tensor, sharded_data, microbatches, "
                   "checkpointing, optimizer_sharding (repeatable).")
@click.option("--processes-per-host", type=int, help="Default: the instance's GPUs.")
@click.option("--efficiency", type=float, default=0.5, show_default=True,
              help="Fraction of the GPUs' peak FLOP/s the model's matmuls reach.")
@click.option("--calibration", "calibration_file", type=click.Path(exists=True, dir_okay=False),
              help="Measured figures (JSON) from an earlier --calibrate.")
@click.option("--calibrate", is_flag=True,
              help="Measure the cluster first: a short job of Shoal's collectives and a matmul "
                   "on the instance type and count given (local: this machine).")
@click.option("--calibration-out", type=click.Path(dir_okay=False),
              help="Where --calibrate saves what it measured, for --calibration.")
@click.option("--role", help="IAM role of the --calibrate job on SageMaker.")
@click.option("--output", type=click.Choice(["text", "json"]), default="text", show_default=True)
def strategy(model, sample_input_shape, measure_blocks, global_batch, instance_type, instance_count, precision,
             optimizer, sequence_length, pins, processes_per_host, efficiency,
             calibration_file, calibrate, calibration_out, role, output):
    """The parallelism a model should train with on a cluster, and why."""
    from shoal.planning.strategy import Constraints, plan_strategy

    constraints = Constraints(pins=_pins(pins), processes_per_host=processes_per_host,
                              efficiency=efficiency)
    plan = plan_strategy(_model(model, sample_input_shape, measure_blocks),
                         global_batch=global_batch,
                         instance_type=instance_type, instance_count=instance_count,
                         precision=precision, optimizer=optimizer,
                         sequence_length=sequence_length, constraints=constraints,
                         calibration=_calibration(calibration_file, calibrate, instance_type,
                                                  instance_count, processes_per_host, role,
                                                  calibration_out, precision))
    if output == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2, default=str))
        return
    _print(plan)


def _print(plan) -> None:
    from rich.table import Table

    from shoal.advice_commands import _console, _flush

    p = plan.predicted
    console = _console()
    chosen, _, why = plan.reason.partition(": ")
    console.print(f"[bold]{chosen}[/]")
    console.print(f"  why: {why}", markup=False)
    console.print(f"  step {p['step_seconds']:.3f} s, {p['samples_per_second']:.1f} samples/s, "
                  f"{p['tflops_per_device']:.1f} TFLOP/s per device; "
                  f"{p['memory_gib_per_device']:.1f} of {p['memory_gib_usable']:.1f} GiB",
                  markup=False)
    console.print("  memory GiB: " + ", ".join(
        f"{k.replace('_', ' ')} {v:.2f}" for k, v in p["memory_gib"].items() if v), markup=False)
    console.print("  time s: " + ", ".join(
        f"{k.replace('_', ' ')} {v:.3f}" for k, v in p["seconds"].items() if v), markup=False)
    console.print(f"  batch per rank {plan.batch_per_rank}; distribution "
                  f"{json.dumps(plan.distribution)}", markup=False)
    for change in plan.script_changes:
        console.print(f"  the script needs: {change}", markup=False)
    table = Table(title=f"runners-up ({plan.considered} considered in "
                        f"{plan.plan_seconds * 1000:.0f} ms)")
    for column in ("configuration", "step s", "GiB", "lost because"):
        table.add_column(column)
    for alt in plan.alternatives:
        table.add_row(alt["description"], f"{alt['predicted']['step_seconds']:.3f}",
                      f"{alt['predicted']['memory_gib_per_device']:.1f}", alt["lost_because"])
    console.print(table)
    _flush(console)

"""``distribution="auto"``: the planner's inputs read from an estimator, and its plan applied.

The model comes from ``model_description`` (a ``transformer:...`` string, ``file.py:factory``,
or a dict of transformer keys) or, failing that, from the hyperparameters SMP's examples and
Hugging Face use for the same shapes (``num_layers``/``num_hidden_layers``,
``hidden_width``/``hidden_size``, ``num_heads``/``num_attention_heads``,
``max_context_width``/``seq_length``, ``vocab_size``).

The training figures come from ``model_description``'s planner keys or the hyperparameters:

* ``global_batch`` (or hyperparameter ``global_batch_size``/``global_batch``): samples per step;
* ``precision``: ``fp32``/``fp16``/``bf16`` (or hyperparameters ``fp16``/``bf16`` true);
* ``optimizer`` (or hyperparameter ``optimizer``), default ``adam``;
* ``pins``: degrees to keep, as ``shoal plan strategy --pin``;
* ``sample_input_shape`` for a factory, and ``measure_blocks`` to time one of its blocks here;
* ``processes_per_host``: for local mode.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from shoal.errors import ValidationError
from shoal.planning import models
from shoal.planning.costs import OPTIMIZER_STATE_BYTES
from shoal.planning.strategy import Constraints, StrategyPlan, plan_strategy

log = logging.getLogger("shoal.planning")

PLANNER_KEYS = ("global_batch", "precision", "optimizer", "pins", "sample_input_shape",
                "measure_blocks", "processes_per_host", "efficiency")
BATCH_HYPERPARAMETERS = ("global_batch_size", "global_batch")
_MODEL_HYPERPARAMETERS = ("layers", "hidden", "heads", "seq", "vocab", "ffn", "kv_heads")


def _truthy(value) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")


def _model(description, hyperparameters: Mapping) -> object:
    if isinstance(description, str):
        if description.startswith("transformer:"):
            return models.parse_description(description)
        return description  # a factory, traced with sample_input_shape
    if isinstance(description, Mapping):
        keys = {k: v for k, v in description.items() if k not in PLANNER_KEYS}
        if keys:
            return models.from_mapping(keys, "model_description")
    found = {}
    for key, value in hyperparameters.items():
        name = models.KEY_ALIASES.get(key, key)
        if name in _MODEL_HYPERPARAMETERS:
            found[name] = value
    if not found:
        raise ValidationError(
            "distribution='auto' needs a model description: pass model_description="
            "'transformer:layers=..,hidden=..,heads=..,seq=..,vocab=..' (or 'file.py:factory' "
            "with sample_input_shape), or set the hyperparameters num_layers, hidden_width, "
            "num_heads, max_context_width and vocab_size")
    return models.from_mapping(found, "the hyperparameters")


def _setting(description, hyperparameters: Mapping, key: str, names=()):
    if isinstance(description, Mapping) and key in description:
        return description[key]
    for name in names:
        if name in hyperparameters:
            return hyperparameters[name]
    return None


def _precision(description, hyperparameters: Mapping) -> str:
    given = _setting(description, hyperparameters, "precision")
    if given is not None:
        return str(given)
    for name in ("bf16", "fp16"):
        if _truthy(hyperparameters.get(name)):
            return name
    return "fp32"


def _global_batch(description, hyperparameters: Mapping) -> int:
    value = _setting(description, hyperparameters, "global_batch", BATCH_HYPERPARAMETERS)
    if value is None:
        raise ValidationError(
            "distribution='auto' needs the global batch (samples per optimizer step): add "
            "'global_batch' to model_description or the hyperparameter global_batch_size")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ValidationError(f"'global_batch' must be an int (got {value!r})") from None


def plan_job(description, hyperparameters: Mapping, instance_type: str,
             instance_count: int) -> StrategyPlan:
    """The plan for a job described by an estimator's settings."""
    hyperparameters = dict(hyperparameters or {})
    model = _model(description, hyperparameters)
    optimizer = _setting(description, hyperparameters, "optimizer", ("optimizer",))
    optimizer = str(optimizer).lower() if optimizer is not None else "adam"
    if optimizer not in OPTIMIZER_STATE_BYTES:
        optimizer = "adam"  # an optimizer the table lacks: size it as Adam, the heaviest common
    settings = description if isinstance(description, Mapping) else {}
    constraints = Constraints(pins=settings.get("pins") or {},
                              processes_per_host=settings.get("processes_per_host"),
                              efficiency=float(settings.get("efficiency", 0.5)))
    if isinstance(model, str):
        from shoal.planning.tracing import profile_factory

        shape = settings.get("sample_input_shape")
        if not shape:
            raise ValidationError("a model factory needs 'sample_input_shape' in "
                                  "model_description (batch first, for example [8, 3, 224, 224])")
        model = profile_factory(model, shape,
                                measure_blocks=bool(settings.get("measure_blocks")))
    return plan_strategy(model, global_batch=_global_batch(description, hyperparameters),
                         instance_type=instance_type, instance_count=instance_count,
                         precision=_precision(description, hyperparameters),
                         optimizer=optimizer, constraints=constraints)


def log_plan(plan: StrategyPlan) -> None:
    log.info("distribution='auto': %s", plan.reason)
    log.info("distribution='auto' chose %s (batch per rank %d)", plan.distribution,
             plan.batch_per_rank)
    for change in plan.script_changes:
        log.info("the training script needs: %s", change)

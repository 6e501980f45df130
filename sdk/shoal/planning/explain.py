"""The planner's answer explained: a configuration in words, its prediction term by term, and
why each runner-up lost (slower, and by which term; or does not fit, and by how much)."""

from __future__ import annotations

from shoal.planning.costs import GIB, Candidate, Estimate, Hardware, Workload


def plain(c: Candidate) -> bool:
    """Runs without the model-parallel library (data parallelism alone)."""
    return (c.tensor == c.pipeline == c.sharded == c.microbatches == 1
            and not c.optimizer_sharding and not c.checkpointing)


def order(e: Estimate):
    c = e.candidate
    # ties go to fewer model-parallel ranks, then plainer features (Megatron's advice)
    return (round(e.step_seconds, 9), c.model_parallel, c.sharded, c.checkpointing,
            c.optimizer_sharding, c.microbatches)


def describe(c: Candidate) -> str:
    parts = [f"data {c.data}"]
    if c.tensor > 1:
        parts.append(f"tensor {c.tensor}")
    if c.pipeline > 1:
        parts.append(f"pipeline {c.pipeline}")
    if c.sharded > 1:
        parts.append(f"sharded data {c.sharded}")
    if c.optimizer_sharding:
        parts.append("optimizer-state sharding")
    if c.microbatches > 1:
        parts.append(f"{c.microbatches} microbatches")
    if c.checkpointing:
        parts.append("activation checkpointing")
    return ", ".join(parts)


def degrees(c: Candidate) -> dict:
    return {"data": c.data, "pipeline": c.pipeline, "tensor": c.tensor,
            "sharded_data": c.sharded}


def predicted(e: Estimate, workload: Workload, hw: Hardware) -> dict:
    step = e.step_seconds
    model_flops = 3 * workload.profile.flops * workload.global_batch
    return {"step_seconds": step, "samples_per_second": workload.global_batch / step,
            "tflops_per_device": model_flops / step / hw.devices / 1e12,
            "memory_gib_per_device": e.memory_bytes / GIB,
            "memory_gib_usable": hw.memory / GIB,
            "memory_gib": {k: v / GIB for k, v in e.memory.items()},
            "seconds": dict(e.time)}


def why_lost(e: Estimate, best: Estimate, hw: Hardware) -> str:
    if e.memory_bytes > hw.memory:
        return (f"does not fit: {e.memory_bytes / GIB:.1f} GiB per device > "
                f"{hw.memory / GIB:.1f} GiB usable")
    worse = {k: e.time[k] - best.time.get(k, 0.0) for k in e.time}
    term = max(worse, key=worse.get)
    slower = e.step_seconds / best.step_seconds - 1
    if slower <= 1e-9:
        if plain(best.candidate):
            return (f"{-slower:.0%} faster by the model, within the margin that keeps plain "
                    "data parallelism (no model-parallel library)")
        if slower < 0:
            return (f"{-slower:.1%} faster by the model but with less memory to spare "
                    f"({e.memory_bytes / GIB:.1f} GiB per device)")
        return "as fast by the model; the pick uses fewer model-parallel ranks or features"
    return (f"{slower:.0%} slower: {term.replace('_', ' ')} "
            f"+{worse[term] * 1000:.1f} ms per step")


def family(c: Candidate) -> str:
    if plain(c):
        return "data"
    if c.sharded > 1:
        return "sharded"
    return f"t{c.tensor}p{c.pipeline}"


def alternatives(best, fitting, found, hw, workload, limit: int) -> list:
    """The runners-up: the best of each other family, the nearest ones, and plain data
    parallelism when it does not fit; each with the reason it lost."""
    chosen, families = [], {family(best.candidate)}
    for e in fitting[1:]:  # the best of each other family, then the nearest runners-up
        if family(e.candidate) not in families:
            families.add(family(e.candidate))
            chosen.append(e)
    for e in fitting[1:]:
        if len(chosen) >= limit + 2:
            break
        if e not in chosen:
            chosen.append(e)
    too_big = [e for e in found if plain(e.candidate) and e.memory_bytes > hw.memory]
    if too_big and not plain(best.candidate):  # say why plain data parallelism is not enough
        chosen.append(min(too_big, key=lambda e: e.memory_bytes))
    chosen = sorted(chosen, key=order)[:limit + 1]
    return [{"degrees": degrees(e.candidate), "microbatches": e.candidate.microbatches,
             "activation_checkpointing": e.candidate.checkpointing,
             "optimizer_sharding": e.candidate.optimizer_sharding,
             "description": describe(e.candidate),
             "predicted": {"step_seconds": e.step_seconds,
                           "memory_gib_per_device": e.memory_bytes / GIB},
             "lost_because": why_lost(e, best, hw)} for e in chosen]

"""Which pipeline rank owns each module: manual placement and SMP's auto-partition.

A module runs on the rank that owns it; its own parameters and buffers live there only.

Manual placement (``auto_partition: False``): ``with smp.partition(i):`` places the modules
created inside it (the innermost context wins), ``smp.set_partition(module, i)`` places a
module after it was created; a module without a placement takes its parent's, and the
root's default is ``default_partition``.

Auto-partition (the default): a traced run of the first microbatch records, per module, its
parameter bytes, the bytes of its outputs, its time and the order modules first ran. The
cost of a module's subtree is ``memory_weight * memory + (1 - memory_weight) * compute``
(each normalised over the whole model; compute is the traced time when
``trace_execution_times`` is set, else the number of modules, as SMP counts it). The tree
is opened from the root, the costliest subtree first, until no unit holds more than half a
rank's share, and the units, in the order they ran, are cut into balanced contiguous
segments, one per rank. A module that was opened runs on the first rank, where the root
runs, so each unit is called from there.

Either way, modules sharing a parameter (a tied embedding and output layer) run together:
auto-partition moves them to the rank of the first of them, a manual placement that splits
them is an error naming both modules and the parameter.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import attrs
import torch
from shoal.modelparallel.errors import SMPPartitionError

_placed: weakref.WeakKeyDictionary[torch.nn.Module, int] = weakref.WeakKeyDictionary()
_context = threading.local()
_patch_lock = threading.Lock()
_patch_depth = 0
_original_init = torch.nn.Module.__init__


def _recording_init(self, *args, **kwargs):
    _original_init(self, *args, **kwargs)
    stack = getattr(_context, "stack", None)
    if stack:
        _placed[self] = stack[-1]


@contextlib.contextmanager
def partition(index: int) -> Iterator[None]:
    """Modules created inside go to pipeline rank ``index`` (ignored by auto-partition)."""
    global _patch_depth
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"smp.partition needs a partition index >= 0 (got {index!r})")
    stack = _context.__dict__.setdefault("stack", [])
    stack.append(index)
    with _patch_lock:
        _patch_depth += 1
        torch.nn.Module.__init__ = _recording_init
    try:
        yield
    finally:
        stack.pop()
        with _patch_lock:
            _patch_depth -= 1
            if _patch_depth == 0:
                torch.nn.Module.__init__ = _original_init


def set_partition(module: torch.nn.Module, index: int) -> None:
    """Places ``module`` (and the children without a placement of their own) on ``index``."""
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"smp.set_partition needs an nn.Module (got {type(module).__name__})")
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"smp.set_partition needs a partition index >= 0 (got {index!r})")
    _placed[module] = index


def named_modules(root: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """Every module by its qualified name ("" is the root), each once."""
    return dict(root.named_modules(remove_duplicate=True))


def shared_parameters(root: torch.nn.Module) -> list[tuple[str, list[str]]]:
    """Each parameter held by more than one module: (parameter name, the modules' names)."""
    holders: dict[int, tuple[str, list[str]]] = {}
    for name, module in named_modules(root).items():
        for pname, param in module.named_parameters(recurse=False):
            full = f"{name}.{pname}" if name else pname
            holders.setdefault(id(param), (full, []))[1].append(name)
    return [entry for entry in holders.values() if len(entry[1]) > 1]


def manual_assignment(root: torch.nn.Module, pp: int, default: int) -> dict[str, int]:
    """Each module's rank from ``smp.partition``/``smp.set_partition``, else its parent's."""
    assignment: dict[str, int] = {}
    for name, module in named_modules(root).items():
        parent = name.rpartition(".")[0] if name else None
        inherited = assignment[parent] if parent is not None else default
        assignment[name] = _placed.get(module, inherited)
    bad = {n: i for n, i in assignment.items() if i >= pp}
    if bad:
        name, index = next(iter(bad.items()))
        raise SMPPartitionError(
            f"module {name or '<root>'!r} is placed on partition {index}, but there are only "
            f"{pp} partitions (pipeline_parallel_degree)")
    for pname, holders in shared_parameters(root):
        ranks = {assignment[h] for h in holders}
        if len(ranks) > 1:
            a, b = holders[0], next(h for h in holders if assignment[h] != assignment[holders[0]])
            raise SMPPartitionError(
                f"modules {a!r} (partition {assignment[a]}) and {b!r} (partition "
                f"{assignment[b]}) share the parameter {pname!r}; modules that share a "
                f"parameter must be placed on the same partition")
    return assignment


@attrs.define
class ModuleTrace:
    """What the traced microbatch recorded for one module (its own call, children apart)."""

    order: int
    param_bytes: int = 0
    output_bytes: int = 0
    seconds: float = 0.0


def auto_assignment(root: torch.nn.Module, traces: dict[str, ModuleTrace], pp: int,
                    memory_weight: float, use_times: bool) -> dict[str, int]:
    """Balanced contiguous segments of the traced module tree, one per pipeline rank."""
    modules = named_modules(root)
    children = _children(modules, traces)
    cost = _subtree_costs(modules, children, traces, memory_weight, use_times)
    units = _open_units(children, cost, pp)
    if len(units) < pp:
        raise SMPPartitionError(f"Model is too small to split into {pp} partitions!")
    segments = _balanced_segments([cost[u] for u in units], pp)
    assignment: dict[str, int] = {}
    for unit, rank in zip(units, segments):
        for name in modules:
            if name == unit or name.startswith(unit + ".") or unit == "":
                assignment.setdefault(name, rank)
    _place_opened(modules, children, assignment)
    assignment[""] = 0  # the step body calls the root on the first rank
    return _keep_shared_together(root, assignment, traces)


def _children(modules, traces) -> dict[str, list[str]]:
    """Each module's direct children, in the order they first ran (unrun ones last). A
    container that never runs itself (an ``nn.ModuleList`` of blocks, which the parent's
    forward loops over) runs when its first child does: sorted by its own order, it would
    come after every sibling that did run, and the segments would not follow the forward."""
    kids: dict[str, list[str]] = {name: [] for name in modules}
    for name in modules:
        if name:
            kids[name.rpartition(".")[0]].append(name)
    late = len(modules)
    first: dict[str, int] = {}
    for name in sorted(modules, key=lambda n: -n.count(".") if n else 1):  # deepest first
        own = traces[name].order if name in traces else late
        first[name] = min([own, *(first[c] for c in kids[name])])
    for name in kids:
        kids[name].sort(key=first.__getitem__)
    return kids


def _subtree_costs(modules, children, traces, memory_weight, use_times) -> dict[str, float]:
    memory, compute = {}, {}
    for name in sorted(modules, key=lambda n: -n.count(".") if n else 1):
        trace = traces.get(name, ModuleTrace(order=len(modules)))
        own_bytes = sum(p.numel() * p.element_size()
                        for p in modules[name].parameters(recurse=False))
        memory[name] = own_bytes + trace.output_bytes + sum(memory[c] for c in children[name])
        compute[name] = (trace.seconds if use_times
                         else 1 + sum(compute[c] for c in children[name]))
    total_m = memory[""] or 1.0
    total_c = compute[""] or 1.0
    return {n: max(1e-6, memory_weight * memory[n] / total_m
                   + (1 - memory_weight) * compute[n] / total_c) for n in modules}


def _open_units(children, cost, pp) -> list[str]:
    """Opens the costliest units (in place, keeping run order) until each is small enough."""
    units = [""]
    share = cost[""] / pp
    while True:
        openable = [u for u in units if children[u] and cost[u] > share / 2]
        if not openable:
            return units
        big = max(openable, key=lambda u: cost[u])
        at = units.index(big)
        units[at:at + 1] = children[big]


def _balanced_segments(costs: list[float], parts: int) -> list[int]:
    """Contiguous segments minimising the largest segment's cost; the segment of each item."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for k in range(1, parts + 1):
        for i in range(k, n - parts + k + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    owner, i = [0] * n, n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        owner[j:i] = [k - 1] * (i - j)
        i = j
    return owner


def _place_opened(modules, children, assignment) -> None:
    """A module that was opened runs where the root runs (the first rank), so every
    remote call starts there and none is made from inside another remote call."""
    for name in modules:
        assignment.setdefault(name, 0)


def _keep_shared_together(root, assignment, traces) -> dict[str, int]:
    for _pname, holders in shared_parameters(root):
        first = min(holders, key=lambda h: traces[h].order if h in traces else 1 << 30)
        for holder in holders:
            for name in list(assignment):
                if name == holder or name.startswith(holder + "."):
                    assignment[name] = assignment[first]
    return assignment

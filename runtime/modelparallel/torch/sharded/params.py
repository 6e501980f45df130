"""The parameters' life under sharded data parallelism: sharded at rest, whole while used.

At wrapping, every parameter that trains is cut into its chunks (layout.py) and this rank
keeps its own as ``p.ds_tensor``; ``p`` itself keeps no storage (``p.data`` is empty, its
shape is ``p.ds_shape``). A parameter smaller than ``sdp_param_persistence_threshold``
elements stays whole as well (persistent: no gather per use; its chunk is still what the
optimizer steps, and it is refreshed after each step). A frozen parameter stays whole.

A module's own parameters are gathered with the core's allgather just before its forward
(one gather for all of them; with ``sdp_hierarchical_allgather: False`` a ring of
point-to-point transfers, every block passing from rank to rank, instead of the core's
host-aware gather) and released right after, unless another module running
around it holds them (a tied weight). Its outputs carry a gradient hook that gathers them
again before the backward reaches the module. When a parameter's gradient is complete
(its post-accumulate hook), the gradient goes to the reducer (grads.py) and the parameter
is released. A forward re-run by activation checkpointing during the backward gathers as
any forward does and leaves the release to the gradient.

From the second step on, the order in which modules gathered in the first one is known,
and gathers run ahead on a thread of their own (a communicator of their own): while a
module computes, the next modules' parameters come in, as long as the parameters
gathered and not yet released stay within ``sdp_max_live_parameters`` elements. The
backward runs through the same list the other way round.

Some modules read their children's weights in their own forward without calling the
children (``nn.MultiheadAttention`` and its ``out_proj``; smp.nn's language-model head and
its embedding tables): their parameters count as the module's own (``owned``).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import Iterable
from typing import Any

import torch
from shoal.dataparallel import core
from shoal.modelparallel.torch.sharded import layout
from shoal.modelparallel.torch.sharded.groups import ShardGroups

# Modules whose forward reads their children's parameters without calling the children.
READS_CHILDREN: tuple[type, ...] = (torch.nn.MultiheadAttention,)


def in_backward() -> bool:
    """Whether the autograd engine is running a backward on this thread."""
    return torch._C._current_graph_task_id() != -1


def tensors_in(value: Any) -> Iterable[torch.Tensor]:
    """The tensors in a module's output (tuples, lists, dicts, Hugging Face outputs)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def gather_rows(shard: torch.Tensor, comm, parts: int, hierarchical: bool = True) -> torch.Tensor:
    """Every rank's ``shard`` (1-D, any dtype), as ``(parts, numel)`` rows."""
    if comm is None or parts == 1:
        return shard.reshape(1, -1).clone()
    raw = shard.contiguous().view(torch.uint8).numpy()
    if hierarchical:
        out = torch.from_numpy(core.allgather(raw, group=comm))
    else:
        out = torch.from_numpy(_ring_allgather(raw, comm))
    return out.view(shard.dtype).reshape(parts, -1)


def _ring_allgather(raw, comm):
    """A flat ring: at hop ``k`` each rank passes on the block it received at hop ``k-1``."""
    import numpy as np

    parts, me = len(comm.ranks), comm.rank
    out = np.empty((parts, raw.size), dtype=raw.dtype)
    out[me] = raw
    right, left = (me + 1) % parts, (me - 1) % parts
    for hop in range(parts - 1):
        send, recv = (me - hop) % parts, (me - hop - 1) % parts
        receiving = core.irecv(out[recv], src=left, tag=hop, group=comm)
        core.isend(out[send], dst=right, tag=hop, group=comm).wait()
        receiving.wait()
    return out


def owned(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters ``module``'s forward uses itself: its own, its subtree's
    (``READS_CHILDREN``), or those of the children a module names in its
    ``reads_children_parameters`` (smp.nn's language-model head)."""
    if isinstance(module, READS_CHILDREN):
        return list(module.parameters())
    found = list(module.parameters(recurse=False))
    for name in getattr(module, "reads_children_parameters", ()):
        child = getattr(module, name, None)
        if isinstance(child, torch.nn.Module):
            found += [p for p in child.parameters() if all(p is not q for q in found)]
    return found


def shard_parameter(p: torch.nn.Parameter, parts: int, rank: int, threshold: int) -> None:
    """Cuts ``p`` into its chunks and keeps chunk ``rank`` as ``p.ds_tensor``; ``p`` keeps no
    storage unless it is persistent (smaller than ``threshold`` elements, or frozen)."""
    persist = p.numel() < threshold or not p.requires_grad
    with torch.no_grad():
        shard = layout.chunk_of(p.detach().reshape(-1), parts, rank)
    shard.ds_numel = shard.numel()
    p.ds_tensor = shard
    p.ds_numel = p.numel()
    p.ds_shape = p.shape
    p.ds_persist = persist
    if not persist:
        p.data = torch.empty(0, dtype=p.dtype)


class ShardedParameters:
    """Shards ``module``'s parameters over ``groups`` and gathers them around their use."""

    def __init__(self, module: torch.nn.Module, groups: ShardGroups, threshold: int,
                 max_live: int, reducer, hierarchical: bool = True) -> None:
        self.groups = groups
        self.parts = groups.degree
        self.reducer = reducer
        self.max_live = max_live
        self.threshold = threshold
        self.hierarchical = hierarchical
        self.gathers = {"inline": 0, "prefetched": 0}  # parameters gathered, by whom
        self.params: list[torch.nn.Parameter] = []
        seen: set[int] = set()
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                self.params.append(p)
        for p in self.params:
            if not hasattr(p, "ds_tensor"):  # (delayed initialization shards as it goes)
                self.shard(p)
        self._holders: dict[int, int] = {}  # forwards running that use the parameter
        self._full: set[int] = set()  # non-persistent parameters gathered now
        # Gathered or on their way (prefetch queued): counted from the moment the compute
        # thread decides, so that every rank makes the same decisions in the same order.
        self._reserved: set[int] = set()
        self._live = 0  # their elements
        self._lock = threading.Lock()
        self._order: list[torch.nn.Module] = []  # gathering modules, first step's order
        self._recording = True
        self._prefetcher = _Prefetcher(self)
        self._handles = []
        for sub in module.modules():
            own = [p for p in owned(sub) if not p.ds_persist]
            if own:
                self._handles.append(sub.register_forward_pre_hook(
                    functools.partial(self._before_forward, own)))
                self._handles.append(sub.register_forward_hook(
                    functools.partial(self._after_forward, own)))
        for p in self.params:
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._grad_ready))
        reducer.attach(self.params)

    # -- at rest -------------------------------------------------------------------------
    def shard(self, p: torch.nn.Parameter) -> None:
        shard_parameter(p, self.parts, self.groups.rank, self.threshold)

    def set_shard(self, p: torch.nn.Parameter, shard: torch.Tensor) -> None:
        """``p``'s chunk becomes ``shard`` (a view of the optimizer's flat partition)."""
        shard.ds_numel = shard.numel()
        p.ds_tensor = shard

    @property
    def live(self) -> int:
        return self._live

    # -- gathering -----------------------------------------------------------------------
    def gather(self, params: list[torch.nn.Parameter], comm=None) -> None:
        """Makes ``params`` whole (those not already), with one allgather."""
        with self._lock:
            todo = [p for p in params if id(p) not in self._full and not p.ds_persist]
            if not todo:
                return
            self.reserve(todo)
        self._prefetcher.wait_for(todo)
        with self._lock:
            todo = [p for p in todo if id(p) not in self._full]
        if todo:
            self.gathers["inline"] += len(todo)
            self._install(todo, self._fetch(todo, comm or self.groups.gather))

    def _fetch(self, params, comm) -> list[torch.Tensor]:
        return list(self._gathered(params, comm))

    def _gathered(self, params, comm):
        """``params``' whole values from one gather, made one at a time: a caller done
        with each before taking the next holds the rows and a parameter's copy or two,
        not a copy of them all."""
        if len(params) == 1:
            rows = gather_rows(params[0].ds_tensor, comm, self.parts, self.hierarchical)
            yield layout.unpad(rows, params[0].ds_numel, params[0].ds_shape)
            return
        sizes = [p.ds_tensor.numel() for p in params]
        rows = gather_rows(torch.cat([p.ds_tensor for p in params]), comm, self.parts,
                           self.hierarchical)
        for p, at, size in zip(params, layout.offsets(sizes), sizes):
            yield layout.unpad(rows[:, at:at + size].contiguous(), p.ds_numel, p.ds_shape)

    def reserve(self, params) -> None:
        """Counts ``params`` as live (the caller holds the lock)."""
        for p in params:
            if id(p) not in self._reserved:
                self._reserved.add(id(p))
                self._live += p.ds_numel

    def _install(self, params, values) -> None:
        with self._lock:
            for p, value in zip(params, values):
                if id(p) not in self._full:
                    p.data = value
                    self._full.add(id(p))

    def release(self, p: torch.nn.Parameter) -> None:
        with self._lock:
            if id(p) in self._full and not self._holders.get(id(p)):
                self._full.discard(id(p))
                self._reserved.discard(id(p))
                self._live -= p.ds_numel
                p.data = torch.empty(0, dtype=p.dtype)

    def release_all(self) -> None:
        """At a step's end: whatever a backward gathered and no gradient released."""
        self._prefetcher.drain()
        for p in self.params:
            self.release(p)

    def full_value(self, p: torch.nn.Parameter) -> torch.Tensor:
        """``p``'s whole value, in new storage (a collective over the sharding group)."""
        if p.ds_persist:
            return p.detach().clone()
        rows = gather_rows(p.ds_tensor, self.groups.control, self.parts, self.hierarchical)
        return layout.unpad(rows, p.ds_numel, p.ds_shape).clone()

    def refresh_persistent(self) -> None:
        """Persistent parameters take their chunks' new values (after a step or a load)."""
        persist = [p for p in self.params if p.ds_persist and p.requires_grad]
        if not persist:
            return
        # each value copied in before the next is made: not a second copy of them all
        with torch.no_grad():
            for p, value in zip(persist, self._gathered(persist, self.groups.control)):
                p.copy_(value)

    # -- hooks ---------------------------------------------------------------------------
    def _before_forward(self, own, module, _args) -> None:
        if self._recording and not in_backward():
            self._order.append(module)
        self.gather(own)
        if not in_backward():
            with self._lock:
                for p in own:
                    self._holders[id(p)] = self._holders.get(id(p), 0) + 1
        self._prefetcher.ahead(module, backward=in_backward())

    def _after_forward(self, own, module, _args, output) -> None:
        if in_backward():  # a checkpointed forward re-run: the gradient releases
            return
        with self._lock:
            for p in own:
                self._holders[id(p)] -= 1
        for p in own:
            self.release(p)
        if torch.is_grad_enabled():
            hook = functools.partial(self._before_backward, own, module)
            for t in tensors_in(output):
                if t.requires_grad and t.grad_fn is not None:
                    t.register_hook(hook)

    def _before_backward(self, own, module, _grad) -> None:
        self.gather(own)
        self._prefetcher.ahead(module, backward=True)

    def _grad_ready(self, p: torch.nn.Parameter) -> None:
        grad, p.grad = p.grad, None
        self.reducer.add(p, grad)
        if not p.ds_persist:
            self.release(p)

    def end_step(self) -> None:
        """The first step's order is the order from now on."""
        self.release_all()
        if self._recording and self._order:
            self._recording = False
            self._prefetcher.plan(self._order)


class _Prefetcher:
    """Gathers the next modules' parameters on a thread of its own, within the budget."""

    def __init__(self, owner: ShardedParameters) -> None:
        self.owner = owner
        self.index: dict[int, list[int]] = {}  # module -> its places in the order
        self.order: list[list[torch.nn.Parameter]] = []
        self.jobs: queue.Queue = queue.Queue()
        self.pending: dict[int, threading.Event] = {}  # parameter -> gathered
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()
        self.error: BaseException | None = None  # a failed gather, raised where waited for

    def plan(self, modules: list[torch.nn.Module]) -> None:
        if self.owner.parts == 1 or self.owner.max_live <= 0:
            return
        for at, module in enumerate(modules):
            self.index.setdefault(id(module), []).append(at)
            self.order.append([p for p in owned(module) if not p.ds_persist])
        self.thread = threading.Thread(target=self._run, name="shoal-sdp-prefetch",
                                       daemon=True)
        self.thread.start()

    def ahead(self, module: torch.nn.Module, backward: bool) -> None:
        """Queues the gathers of the modules after ``module`` (before it, in a backward)
        while the budget allows: the next module alone first, then twice as many modules
        per gather, so that the compute waits for a small gather only and the rest comes
        in few collectives."""
        places = self.index.get(id(module))
        if not places:
            return
        owner = self.owner
        budget = owner.max_live - owner.live
        step = -1 if backward else 1
        at = places[0] + step
        batches: list[list[torch.nn.Parameter]] = []
        size, taken = 1, 0
        with owner._lock:
            batch: list[torch.nn.Parameter] = []
            while 0 <= at < len(self.order) and budget > 0:
                for p in self.order[at]:
                    if id(p) in owner._reserved or any(p is q for b in (batch, *batches)
                                                       for q in b):
                        continue
                    if p.ds_numel > budget:
                        budget = 0
                        break
                    budget -= p.ds_numel
                    batch.append(p)
                at += step
                taken += 1
                if taken == size and batch:
                    batches.append(batch)
                    batch, size, taken = [], size * 2, 0
            if batch:
                batches.append(batch)
            for batch in batches:
                owner.reserve(batch)
        for batch in batches:
            done = threading.Event()
            with self.lock:
                for p in batch:
                    self.pending[id(p)] = done
            self.jobs.put((batch, done))

    def _run(self) -> None:
        while True:
            batch, done = self.jobs.get()
            if batch is None:
                return
            try:
                if self.error is None:
                    self.owner.gathers["prefetched"] += len(batch)
                    self.owner._install(batch,
                                        self.owner._fetch(batch, self.owner.groups.prefetch))
            except BaseException as exc:  # noqa: BLE001 - the compute thread raises it
                self.error = exc
            finally:
                with self.lock:
                    for p in batch:
                        self.pending.pop(id(p), None)
                done.set()

    def wait_for(self, params) -> None:
        with self.lock:
            events = {id(e): e for p in params if (e := self.pending.get(id(p)))}
        self._wait(events.values())

    def drain(self) -> None:
        with self.lock:
            events = {id(e): e for e in self.pending.values()}
        self._wait(events.values())

    def _wait(self, events) -> None:
        for event in events:
            event.wait()
        if self.error is not None:
            raise self.error

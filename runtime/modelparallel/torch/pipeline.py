"""The pipeline engine: SMP's step leader and followers over Shoal's point-to-point transfers.

The step body runs on the pipeline's first rank (the leader), once per microbatch; every
module call whose module another rank owns becomes a request to that rank (remote.py); the
other ranks (followers) serve requests while they are inside ``smp.step`` and receive each
microbatch's return value, so ``smp.step`` returns the same outputs on every rank. Which
request or microbatch a rank works on next is the scheduler's choice (scheduler.py).
"""

from __future__ import annotations

import itertools
import logging
import threading
import traceback
import weakref
from collections.abc import Callable
from typing import Any

import torch
from shoal.modelparallel.errors import SMPPeerError, SMPUsageError
from shoal.modelparallel.torch import remote
from shoal.modelparallel.torch.scheduler import BACKWARD, FORWARD, Scheduler, current_task
from shoal.modelparallel.torch.transport import Mailbox, Message, Transport

log = logging.getLogger("shoal.modelparallel")

# Message kinds (0 is left unused).
CALL, CALL_REPLY, GRAD, GRAD_REPLY, OUTPUT, STEP_END, STEP_ERROR = range(1, 8)
# A microbatch's result with at most this many tensor bytes (a loss) reaches the followers
# in the step's STEP_END message, with the others; a larger one is sent when it is ready.
HELD_OUTPUT_BYTES = 1024


class _Call:
    """One remote call from this rank: sends the request, waits for the owner's replies."""

    def __init__(self, engine: Engine, owner: int, module: str, args, kwargs) -> None:
        self.engine, self.owner, self.module = engine, owner, module
        self.call_id = next(engine._call_ids)
        self.blob, self.tensors = remote.pack((args, kwargs))
        # Weak: the autograd node keeps this call until its backward, and the task's result
        # (the loss) keeps the node; a strong reference would close a cycle through the
        # graph that Python's collector cannot see, and every step's activations would leak.
        task = current_task()
        self._task = weakref.ref(task) if task is not None else None
        self.grad_enabled = torch.is_grad_enabled()  # Function.forward runs without grad
        self.out_blob: bytes = b""

    @property
    def task(self):
        return self._task() if self._task is not None else None

    def run_forward(self) -> list[torch.Tensor]:
        task = self.task
        request = remote.CallRequest(
            self.call_id, task.microbatch, self.module, self.blob, self.grad_enabled)
        tensors, self.tensors = self.tensors, []  # sent: the owner keeps what it needs
        reply, tensors = self.engine._request(self, task, self.owner, CALL, request, tensors)
        if reply.error:
            raise SMPPeerError(f"module {self.module!r} failed on pipeline rank "
                               f"{self.owner}:\n{reply.error}")
        self.out_blob = reply.blob
        return tensors

    def run_backward(self, grads: list, input_count: int) -> list:
        present = tuple(i for i, g in enumerate(grads) if g is not None)
        # The backward may run in another task than the forward did (a follower serves
        # them as separate requests): the waiting task is the one running now.
        task = current_task() or self.task
        request = remote.GradRequest(self.call_id, task.microbatch, present)
        reply, tensors = self.engine._request(
            self, task, self.owner, GRAD, request, [grads[i] for i in present])
        if reply.error:
            raise SMPPeerError(f"the backward of module {self.module!r} failed on pipeline "
                               f"rank {self.owner}:\n{reply.error}")
        result: list = [None] * input_count
        for i, g in zip(reply.present, tensors):
            result[i] = g
        return result


class Engine:
    """One rank's part of the pipeline (``rank`` and ``size`` are pipeline ranks)."""

    def __init__(self, rank: int, size: int, group, pipeline: str,
                 reply_timeout: float = 300.0, timeline=None) -> None:
        self.rank, self.size = rank, size
        self.reply_timeout = reply_timeout
        self.timeline = timeline
        self.scheduler = Scheduler(pipeline, timeline)
        self.transport = Transport(group)
        self.modules: dict[str, torch.nn.Module] = {}
        self.forwards: dict[str, Callable] = {}
        self.owner: dict[str, int] = {}
        self.active = False  # inside a step, with remote calls on
        self._call_ids = itertools.count(1)
        self._pending: dict[tuple[int, int], tuple[Any, Any]] = {}  # (owner, call) -> call
        self._kept: dict[tuple[int, int], remote.KeptCall] = {}
        self._outputs: dict[int, Any] = {}
        # Small results of this step's microbatches (the leader's), sent with STEP_END.
        self._held_outputs: list[tuple[int, bytes, list[torch.Tensor]]] = []
        self._step_ended = False
        self._step_error: str | None = None
        # The first error this rank's own modules raised in the step (served for the
        # leader): the follower ends its step with it, not with the leader's relay of it.
        self._own_error: BaseException | None = None
        self._lock = threading.Lock()
        # Requests are served only inside this rank's own step: the leader may start its
        # next step (and send its requests) before this rank has left the last one and
        # updated its parameters. Requests that come outside a step wait here.
        self._accepting = False
        self._parked: list[Message] = []
        self.peak_kept = 0  # most calls whose activations this rank held at once
        self.mailbox = Mailbox(self.transport, self._deliver, self.scheduler.fail) if size > 1 else None

    # -- placing modules ----------------------------------------------------------------
    def install(self, modules: dict[str, torch.nn.Module], owner: dict[str, int]) -> None:
        """Routes the forward of every module another rank owns through the engine (by the
        module's name). A module this rank owns always runs here: its forward stays as it
        is, unless it is an ``nn.Sequential`` with children on other ranks."""
        self.modules, self.owner = modules, owner
        for name, module in modules.items():
            segmented = None
            if type(module).forward is torch.nn.Sequential.forward:
                segmented = self._segmented(name, module)
            original = segmented or module.forward
            self.forwards[name] = original
            if owner[name] != self.rank:
                module.forward = self._dispatcher(name, original)
            elif segmented is not None:
                module.forward = segmented

    def _segmented(self, name: str, sequential: torch.nn.Sequential) -> Callable | None:
        """An ``nn.Sequential`` whose consecutive children share an owner hands the owner
        the whole run in one call (one transfer each way), not one call per child. None
        when every child lives on this rank (its own forward does the same)."""
        prefix = f"{name}." if name else ""
        children = [(f"{prefix}{key}", child) for key, child in sequential._modules.items()]
        runs: list[tuple[int, str, list]] = []  # (owner, request key, children)
        i = 0
        while i < len(children):
            owner = self.owner[children[i][0]]
            j = i
            while j < len(children) and self.owner[children[j][0]] == owner:
                j += 1
            runs.append((owner, f"{name}[{i}:{j}]", [child for _, child in children[i:j]]))
            i = j
        if all(owner == self.rank for owner, _, _ in runs):
            return None
        # A run this rank owns, or of one child (whose own forward decides), runs here.
        runs = [(-1 if owner == self.rank or len(run) == 1 else owner, key, run)
                for owner, key, run in runs]

        def forward(x):
            for owner, key, run in runs:
                if owner < 0 or not self.active:
                    for child in run:
                        x = child(x)
                else:
                    x = self._remote_call(owner, key, (x,), {})
            return x

        return forward

    def _local_forward(self, key: str) -> Callable:
        """The forward a request names: a module's, or a run of a Sequential's children."""
        if key in self.forwards:
            return self.forwards[key]
        name, _, span = key.rpartition("[")
        start, end = (int(v) for v in span.rstrip("]").split(":"))
        run = list(self.modules[name]._modules.values())[start:end]

        def forward(x):
            for child in run:
                x = child(x)
            return x

        self.forwards[key] = forward  # the same run is asked for in every microbatch
        return forward

    def _dispatcher(self, name: str, original: Callable) -> Callable:
        """The forward of a module another rank owns: a request to it inside a step."""
        owner = self.owner[name]

        def forward(*args, **kwargs):
            if not self.active:
                return original(*args, **kwargs)
            return self._remote_call(owner, name, args, kwargs)
        forward.__wrapped__ = original
        return forward

    def _remote_call(self, owner: int, name: str, args, kwargs):
        call = _Call(self, owner, name, args, kwargs)
        if call.task is None:
            raise SMPUsageError(f"module {name!r} lives on pipeline rank {owner}; it can only "
                                "be called inside an smp.step function")
        if torch.is_grad_enabled():
            anchor = torch.empty(0, requires_grad=True)
            outputs = remote.RemoteFunction.apply(call, anchor, *call.tensors)
        else:
            outputs = call.run_forward()
        return remote.unpack(call.out_blob, list(outputs))

    def _request(self, call: _Call, task, owner: int, kind: int, meta, tensors):
        key = (owner, call.call_id)
        with self._lock:
            self._pending[key] = task
        self.scheduler.expect(task)
        if self.timeline:
            self.timeline.instant("call" if kind == CALL else "grad", "transfer", peer=owner,
                                  module=call.module, microbatch=task.microbatch,
                                  bytes=sum(t.numel() * t.element_size() for t in tensors))
        self.transport.send_tensors(owner, kind, meta, tensors)
        what = "outputs" if kind == CALL else "input gradients"
        return self.scheduler.wait_reply(
            task, self.reply_timeout,
            f"pipeline rank {owner} sent no {what} of module {call.module!r} within "
            f"{self.reply_timeout:g}s (SHOAL_COLLECTIVE_TIMEOUT)")

    # -- receiving ------------------------------------------------------------------------
    def _deliver(self, message: Message) -> None:
        kind, meta = message.kind, message.meta
        if kind in (CALL_REPLY, GRAD_REPLY):
            with self._lock:
                task = self._pending.pop((message.source, meta.call_id))
            self.scheduler.deliver(task, (meta, message.tensors))
        elif kind in (CALL, GRAD):
            with self._lock:
                if not self._accepting:
                    self._parked.append(message)
                    return
            self._serve(message)
        elif kind == OUTPUT:
            microbatch, blob = meta
            self._outputs[microbatch] = remote.unpack(blob, message.tensors)
            self.scheduler.notify()
        elif kind in (STEP_END, STEP_ERROR):
            if kind == STEP_END and meta:
                start = 0
                for microbatch, blob, count in meta:
                    tensors = message.tensors[start:start + count]
                    start += count
                    self._outputs[microbatch] = remote.unpack(blob, tensors)
            with self._lock:
                self._accepting = False  # what comes next belongs to the next step
            self._step_error = meta if kind == STEP_ERROR else None
            self._step_ended = True
            self.scheduler.notify()

    def _serve(self, message: Message) -> None:
        meta = message.meta
        if message.kind == CALL:
            self.scheduler.spawn(f"fwd-{meta.module}", meta.microbatch, FORWARD,
                                 lambda: self._serve_call(message))
        else:
            self.scheduler.spawn(f"bwd-{meta.call_id}", meta.microbatch, BACKWARD,
                                 lambda: self._serve_grad(message))

    def _accept(self) -> None:
        """Opens this rank's step to requests, first those that came early."""
        with self._lock:
            self._accepting = True
            parked, self._parked = self._parked, []
        for message in parked:
            self._serve(message)

    def _serve_call(self, message: Message) -> None:
        request: remote.CallRequest = message.meta
        try:
            inputs = remote.mark_inputs(message.tensors, message.requires_grad)
            args, kwargs = remote.unpack(request.blob, inputs)
            with torch.set_grad_enabled(request.grad_enabled):
                result = self._local_forward(request.module)(*args, **kwargs)
            blob, outputs = remote.pack(result)
            if request.grad_enabled and any(o.requires_grad for o in outputs):
                self._kept[(message.source, request.call_id)] = remote.KeptCall(inputs, outputs)
                self.peak_kept = max(self.peak_kept, len(self._kept))
            reply = remote.CallReply(request.call_id, blob)
        except Exception as exc:  # noqa: BLE001 - the caller raises it with the trace
            self._keep_own_error(exc)
            reply, outputs = remote.CallReply(request.call_id, b"", traceback.format_exc()), []
        self.transport.send_tensors(message.source, CALL_REPLY, reply, outputs)

    def _serve_grad(self, message: Message) -> None:
        request: remote.GradRequest = message.meta
        kept = self._kept.pop((message.source, request.call_id), None)
        try:
            if kept is None:
                present, grads = (), []
            else:
                present, grads = remote.run_backward(kept, request.present, message.tensors)
            reply = remote.GradReply(request.call_id, present)
        except Exception as exc:  # noqa: BLE001
            self._keep_own_error(exc)
            reply, grads = remote.GradReply(request.call_id, (), traceback.format_exc()), []
        self.transport.send_tensors(message.source, GRAD_REPLY, reply, grads)

    def _keep_own_error(self, exc: BaseException) -> None:
        with self._lock:
            if self._own_error is None:
                self._own_error = exc

    # -- a step -----------------------------------------------------------------------------
    def lead(self, bodies: list[Callable[[], Any]], active: int) -> list[Any]:
        """Runs each microbatch's step body here (at most ``active`` in flight); every
        follower receives each microbatch's result. Returns the results in order."""
        results: list[Any] = [None] * len(bodies)
        done: list = []
        cv = threading.Condition()
        started = itertools.count()

        def finished(task):
            with cv:
                done.append(task)
                cv.notify_all()

        def start_next():
            mb = next(started)
            if mb < len(bodies):
                self.scheduler.spawn(f"mb{mb}", mb, FORWARD, self._leading(mb, bodies[mb]),
                                     finished)

        self.active = True
        began = self.timeline.now() if self.timeline else 0.0
        self._held_outputs = []
        self._accept()
        self.scheduler.open()
        try:
            for _ in range(min(active, len(bodies))):
                start_next()
            for _ in range(len(bodies)):
                with cv:
                    cv.wait_for(lambda: done)
                    task = done.pop(0)
                if task.error is not None:
                    self._end_step(error=task.error)
                    raise task.error
                results[task.microbatch] = task.result
                start_next()
            self._end_step()
        finally:
            with self._lock:
                self._accepting = False
            self.scheduler.close()
            self.active = False
            if self.timeline:
                self.timeline.span("step", "step", began, self.timeline.now())
        return results

    def _leading(self, mb: int, body: Callable[[], Any]) -> Callable[[], Any]:
        def run():
            result = body()
            if self.size > 1:
                blob, tensors = remote.pack(result)
                if sum(t.numel() * t.element_size() for t in tensors) <= HELD_OUTPUT_BYTES:
                    # A loss or a few numbers: a copy of them as they are now goes to the
                    # followers with the step's end, one message for all microbatches.
                    held = [t.detach().clone() for t in tensors]
                    with self._lock:
                        self._held_outputs.append((mb, blob, held))
                else:
                    tensors = [t.detach() for t in tensors]
                    for follower in range(1, self.size):
                        self.transport.send_tensors(follower, OUTPUT, (mb, blob), tensors)
            return result
        return run

    def _end_step(self, error: BaseException | None = None) -> None:
        with self._lock:
            held, self._held_outputs = self._held_outputs, []
        meta = [(mb, blob, len(tensors)) for mb, blob, tensors in held]
        tensors = [t for _, _, group in held for t in group]
        for follower in range(1, self.size):
            if error is None:
                self.transport.send_tensors(follower, STEP_END, meta, tensors)
            else:
                text = "".join(traceback.format_exception(error))
                self.transport.send_tensors(follower, STEP_ERROR, text, [])
        self.scheduler.wait_idle()
        self._kept.clear()  # calls whose backward never came (an evaluation step)

    def follow(self, microbatches: int) -> list[Any]:
        """Serves the leader's requests until its step ends; the microbatches' results."""
        self.active = True
        began = self.timeline.now() if self.timeline else 0.0
        self._accept()
        self.scheduler.open()
        try:
            self.scheduler.wait_idle(lambda: self._step_ended)
        finally:
            self.scheduler.close()
            self.active = False
            self._step_ended = False
            self._kept.clear()
            if self.timeline:
                self.timeline.span("step", "step", began, self.timeline.now())
        own, self._own_error = self._own_error, None
        if self._step_error is not None:
            error, self._step_error = self._step_error, None
            if own is not None:
                # The step failed here: this rank's error is the job's root cause, and
                # it ends with it (its peers end with SMPPeerError, a relay of it).
                raise own
            raise SMPPeerError(f"the step failed on pipeline rank 0:\n{error}")
        outputs = [self._outputs.pop(mb, None) for mb in range(microbatches)]
        return outputs

    def begin_backward(self) -> None:
        """The running microbatch turns to its backward (the schedule may switch)."""
        task = current_task()
        if task is not None:
            self.scheduler.switch_phase(task, BACKWARD)

    def close(self) -> None:
        if self.mailbox is not None and not self.mailbox.close():
            log.warning("the pipeline's receiving thread did not end within 10 s")

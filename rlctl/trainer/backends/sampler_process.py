"""The local backend's sampler in a process of its own, so that sampling and training run at once on two cores.

In one process the sampler's thread and the training step take turns on the interpreter lock: on the tiny model
both are mostly Python (module calls, one forward pass per token), so together they took their sum, not their
max, and one core idled (issue 40: 51.5 ms a step against 28.4 ms for the longer of the two). Here the sampler
(`BatchedSampler`, unchanged) runs in a child forked from the trainer once the model is built:

- **The weights.** The base weights are the parent's pages, shared copy-on-write by the fork and never written.
  The adapter goes through shared memory: `stage` copies the newly published tensors (and their version) into
  tensors both processes map, under a lock, and tells the child, which copies them out under the same lock into
  its sampler's staging (taken up when its batch has emptied, as in one process). What the child takes is always
  one version's tensors with that version's number.
- **The requests.** `sample` sends the request over a pipe and waits; a thread of the parent receives the
  answers (the completions, or the error the sampler raised) and wakes the waiting callers. Many requests are in
  flight at once: the child's sampler batches them as before.
- **Threads.** libgomp (torch's OpenMP on Linux) hangs in a forked child that uses more than one thread after
  its parent did: the child samples on one thread, which is the trainer's share of 2 cores anyway
  (`split_cpu_threads`). On CUDA the sampler stays a thread (CUDA cannot be forked).
- **Failures.** A child that dies fails every waiting and later request (counted by the sampling budget); the
  child ignores SIGTERM and SIGINT (the trainer stops it when it stops) and ends when the parent closes the pipe
  or dies.

Opt-in (`tinker.sampler: process`; the default is `thread`): on a machine whose cores other work keeps busy there
is no idle core to take, and the child then competes with the training step for the same cores. Measured by
`benchmarks/sampler_overlap.py` (the overlap of sampling and training in one process, and the CPU each costs) and
`benchmarks/peer_trl.py --only rlctl --samplers --against badaac7` (the offline echo pipeline with each sampler,
beside the code of issue 40's filing in the same run); figures in docs/TRAINER.md#local-sampling: alone beside
training it overlaps fully (1.95, against 1.22 for the thread), but in the pipeline it gives 1.21x the filing's
steps/s where the thread sampler gives 1.15x (issue 40's goal: 1.6x), since atroposlib's environment loop, not
sampling, now holds the pipeline; beside other work it lost (0.60-0.81x the thread sampler at load average 7-11).
Make it the default when it also holds its own on a busy machine (e.g. by sampling on the cores the step leaves
idle only) and the pipeline is no longer held elsewhere; delete it (the thread sampler then serves every case)
when sampling and training no longer contend for one interpreter lock (a free-threaded interpreter, or sampling
that spends its time outside Python), or if a quiet machine shows no gain.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

import torch
from torch import nn

from rlctl.trainer.backends.base import Completion
from rlctl.trainer.backends.sampler import BatchedSampler, PendingSample

STOP_TIMEOUT_S = 30.0


def use_process_sampler(choice: str, device: torch.device) -> bool:
    """`tinker.sampler: process` on the CPU (CUDA cannot be forked: there the sampler stays a thread)."""
    return choice == "process" and device.type == "cpu"


class ProcessSampler:
    """`BatchedSampler`'s `sample`, `stage` and `close`, served by a forked child process."""

    def __init__(
        self,
        training_model: nn.Module,
        tokenizer: Any,
        device: torch.device,
        default_generator: torch.Generator,
        shared_prefix: bool = True,
    ) -> None:
        trainable = [parameter for parameter in training_model.parameters() if parameter.requires_grad]
        with torch.no_grad():
            self._shared = [parameter.detach().clone().share_memory_() for parameter in trainable]
        self._shared_version = torch.zeros(1, dtype=torch.long).share_memory_()
        context = multiprocessing.get_context("fork")
        self._shared_lock = context.Lock()
        self._conn, child_conn = context.Pipe()
        # os.fork, not multiprocessing.Process: its exit handler would wait for a child that outlives the
        # trainer's interpreter by design (it ends when the pipe closes).
        self._pid = os.fork()
        if self._pid == 0:  # the child: serve, then leave without the parent's exit handlers
            code = 1
            try:
                self._conn.close()  # the parent's end: its closing (or the parent's death) ends the child
                _child_main(
                    child_conn,
                    training_model,
                    tokenizer,
                    device,
                    default_generator,
                    shared_prefix,
                    self._shared,
                    self._shared_version,
                    self._shared_lock,
                )
                code = 0
            finally:
                os._exit(code)
        child_conn.close()
        self._send_lock = threading.Lock()
        self._waiting: dict[int, PendingSample] = {}
        self._waiting_lock = threading.Lock()
        self._keys = itertools.count()
        self._ended: BaseException | None = None
        self._receiver = threading.Thread(target=self._receive, name="sampler-answers", daemon=True)
        self._receiver.start()

    def stage(self, version: int, trainable: Sequence[torch.Tensor]) -> None:
        """As `BatchedSampler.stage`: the child takes this version's adapter up once its batch has emptied."""
        with torch.no_grad(), self._shared_lock:
            for shared, tensor in zip(self._shared, trainable, strict=True):
                shared.copy_(tensor.detach())
            self._shared_version[0] = version
        self._send(("stage",))

    def sample(self, pending: PendingSample) -> list[Completion]:
        key = next(self._keys)
        with self._waiting_lock:
            if self._ended is not None:
                raise RuntimeError("the sampling process has ended") from self._ended
            self._waiting[key] = pending
        request = (pending.request, pending.max_new_tokens, pending.stop_ids)
        try:
            self._send(("sample", key, *request))
        except OSError as error:
            self._end(error)
        return pending.wait()

    def close(self) -> None:
        """Ends the child; requests still waiting fail."""
        with contextlib.suppress(OSError):  # already gone
            self._send(("close",))
        if not _waited(self._pid, STOP_TIMEOUT_S):
            os.kill(self._pid, signal.SIGKILL)
            os.waitpid(self._pid, 0)
        self._conn.close()
        self._receiver.join(STOP_TIMEOUT_S)
        self._end(RuntimeError("the sampler was closed"))

    def _send(self, message: tuple[Any, ...]) -> None:
        with self._send_lock:
            self._conn.send(message)

    def _receive(self) -> None:
        while True:
            try:
                key, result, error = self._conn.recv()
            except (EOFError, OSError) as ended:
                self._end(ended)
                return
            with self._waiting_lock:
                pending = self._waiting.pop(key, None)
            if pending is not None:
                pending.result, pending.error = result, error
                pending.done.set()

    def _end(self, cause: BaseException) -> None:
        """Every waiting request fails with `cause`, and every later one."""
        with self._waiting_lock:
            if self._ended is None:
                self._ended = cause
            waiting, self._waiting = list(self._waiting.values()), {}
        for pending in waiting:
            pending.error = RuntimeError(f"the sampling process ended ({type(cause).__name__}: {cause})")
            pending.done.set()


def _waited(pid: int, timeout_s: float) -> bool:
    """Whether child `pid` ended (and was reaped) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
        time.sleep(0.01)  # a child's end has no event to wait on here
    return False


def _child_main(
    conn: Connection,
    model: nn.Module,
    tokenizer: Any,
    device: torch.device,
    generator: torch.Generator,
    shared_prefix: bool,
    shared: list[torch.Tensor],
    shared_version: torch.Tensor,
    shared_lock: Any,
) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the trainer ends this process when it stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    torch.set_num_threads(1)  # libgomp: one thread only in a forked child (module docstring)
    send_lock = threading.Lock()
    keys: dict[PendingSample, int] = {}

    def answered(pending: PendingSample) -> None:
        key = keys.pop(pending)
        with send_lock:
            try:
                conn.send((key, pending.result, pending.error))
            except OSError:
                return  # the parent is gone
            except Exception as error:  # noqa: BLE001 - an error that does not pickle goes back as text
                conn.send((key, None, RuntimeError(f"{type(pending.error).__name__}: {pending.error} ({error})")))

    sampler = BatchedSampler(model, tokenizer, device, generator, shared_prefix=shared_prefix, on_answered=answered)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        if message[0] == "sample":
            _, key, request, max_new_tokens, stop_ids = message
            pending = PendingSample(request, max_new_tokens=max_new_tokens, stop_ids=stop_ids)
            keys[pending] = key
            sampler.submit(pending)
        elif message[0] == "stage":
            with shared_lock:
                sampler.stage(int(shared_version[0]), shared)
        else:
            break
    sampler.close()

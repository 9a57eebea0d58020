"""Where the RewardCore runs: on one thread of the serving process, or in a child process of its own.

Both runners offer the core's operations as typed methods (`runner.apply_update(key, pairs)` runs
`RewardCore.apply_update` there), run them one at a time in submission order (each call enqueues before it
returns, so the caller's order is the core's order) and answer with an asyncio future. The batcher relies on that
order: it may submit the next batch, or an update, while one still runs.

Why a process: the HTTP and gRPC servers spend Python time on every request, and a model thread in the same
process must win the GIL back after every tensor operation. Measured with 32 HTTP clients on a 2-core CPU, the
tiny model's forward pass took 23 ms per batch of 16 inside the serving process against 12 ms alone. In a process
of its own it keeps its own interpreter (servers built for throughput, vLLM's engine core among them, split the
same way). A thread remains for tests that look inside the model and for debugging.

The child process: started with `spawn` (never fork a process that runs gRPC and torch threads), it loads the core
itself (the model never crosses the socket), ignores SIGINT (a Ctrl-C reaches the whole process group; the parent
decides when to stop and asks the child to checkpoint first), and is SIGKILLed by the kernel if the parent dies.
Calls and answers are pickled frames on a Unix socket pair (`_frame`, below). An exception raised by a call
travels back and is raised to that caller; the child keeps serving, except after a journal write failed
(UnjournaledUpdate): it exits, and the service with it, so that a restart comes back from the journal.
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import logging
import multiprocessing
import os
import pickle
import signal
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from cooper.config import RewardConfig
from cooper.runtime.durability import UnjournaledUpdate
from cooper.runtime.ledger import SavedCheckpoint
from cooper.services.reward.core import BatchScores, RewardCore
from cooper.services.reward.items import ModelInfo, PreferencePair, UpdateResult
from cooper.services.reward.model_process import spawn, take_early

log = logging.getLogger("cooper.reward")

T = TypeVar("T")


class ModelUnavailable(Exception):
    """The model process is gone (crashed or killed); nothing more can be scored until the service restarts."""


class Runner:
    """RewardCore's operations, each run after everything submitted before; the future has its result or error.
    A subclass says where the core runs (`call`) and how it stops (`close`)."""

    alive: bool
    on_exit: Callable[[], None] | None  # called on the event loop if the model dies while serving

    def call(self, operation: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Run `operation(core, *args)`, `operation` a function of RewardCore."""
        raise NotImplementedError

    async def close(self) -> None:
        """Finish what was submitted, then release the thread or process."""
        raise NotImplementedError

    def submit(self, method: str, *args: Any) -> asyncio.Future[Any]:
        """core.<method>(*args) by name, for a debugger or a test; the service calls the typed methods below."""
        return self.call(getattr(RewardCore, method), *args)

    def info(self) -> asyncio.Future[ModelInfo]:
        return self.call(RewardCore.info)

    def score_tokens(self, token_lists: list[list[int]]) -> asyncio.Future[BatchScores]:
        return self.call(RewardCore.score_tokens, token_lists)

    def score_texts(self, texts: list[tuple[str, str, str]]) -> asyncio.Future[BatchScores]:
        return self.call(RewardCore.score_texts, texts)

    def apply_update(self, key: str, pairs: list[PreferencePair],
                     optimizer_steps: int = 0) -> asyncio.Future[UpdateResult]:
        return self.call(RewardCore.apply_update, key, pairs, optimizer_steps)

    def save(self, tag: str) -> asyncio.Future[SavedCheckpoint]:
        return self.call(RewardCore.save, tag)

    def save_if_unsaved(self, tag: str) -> asyncio.Future[SavedCheckpoint | None]:
        return self.call(RewardCore.save_if_unsaved, tag)

    def stage_checkpoint(self, path: str) -> asyncio.Future[None]:
        return self.call(RewardCore.stage_checkpoint, path)

    def staged(self) -> asyncio.Future[bool]:
        return self.call(RewardCore.staged)

    def swap_staged(self) -> asyncio.Future[ModelInfo]:
        return self.call(RewardCore.swap_staged)


class ThreadRunner(Runner):
    """The core on a single worker thread of this process."""

    def __init__(self, core: RewardCore):
        self.core = core
        self.alive = True
        self.on_exit: Callable[[], None] | None = None  # a thread does not die on its own
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-rm")

    @classmethod
    async def start(cls, config: RewardConfig) -> ThreadRunner:
        return cls(await asyncio.to_thread(RewardCore.load, config))

    def call(self, operation: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        return self.run(operation, self.core, *args)

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """Any function on the model thread, in order with the core's calls (tests look inside the model this way)."""
        return asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        self.alive = False
        await self.run(RewardCore.close, self.core)  # a background checkpoint lands before the thread goes
        await asyncio.to_thread(self._executor.shutdown)


class ProcessRunner(Runner):
    """The core in a child process, over a Unix socket pair that the event loop reads and writes itself.

    Why on the loop, not on threads: with 32 clients of one item on 2 cores, a sender thread and a reader thread
    (each call handed over through a queue, each answer back through call_soon_threadsafe, and the GIL won back at
    every hand-over) took a quarter of the serving process's CPU. The loop's transport never blocks: a large call
    (an update's pairs) waits in its buffer while the child is busy with the call before it."""

    def __init__(self, process: multiprocessing.process.BaseProcess, link: _CallLink):
        self.process = process
        self.alive = True
        self.on_exit: Callable[[], None] | None = None
        self._link = link
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._closing = False
        self._exit: asyncio.Task[None] | None = None  # reports an exit nobody asked for; held, as the loop holds tasks weakly
        link.on_message = self._resolve
        link.on_lost = self._lost

    @classmethod
    async def start(cls, config: RewardConfig, writes: bool = True) -> ProcessRunner:
        """Start the child (or take the one `cooper serve reward` started early, model_process.py) and wait until it
        has loaded the model; a load error is raised here. `writes`: the child journals and checkpoints
        (RewardCore.durability)."""
        started = take_early(config, writes) or spawn(config, writes)
        process, parent_end = started.process, started.link
        loop = asyncio.get_running_loop()
        try:
            _, link = await loop.create_unix_connection(_CallLink, sock=parent_end)
            ok, value = await link.first_message
        except BaseException:
            process.kill()
            raise
        if ok:
            return cls(process, link)
        link.close()
        await asyncio.to_thread(process.join, 10)
        if ok is None:  # the child's end closed before it said anything: it died while loading
            raise ModelUnavailable(f"the reward model process exited with code {process.exitcode} while loading the "
                                   "model; see its log above")
        raise value

    def call(self, operation: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if not self.alive:
            future.set_exception(ModelUnavailable("the reward model process has exited; restart the service"))
            return future
        call_id = next(self._ids)
        try:
            frame = _frame((call_id, operation, args))
        except Exception as err:  # an argument that does not pickle: fail that call only
            future.set_exception(TypeError(f"cannot send {operation.__name__} to the model process: {err}"))
            return future
        self._pending[call_id] = future
        self._link.write(frame)
        return future

    async def close(self) -> None:
        self._closing = True
        if self.alive:
            self._link.write(_frame(None))  # the child finishes what it was sent, then exits
        await asyncio.to_thread(self._join)
        self._link.close()

    def kill(self) -> None:
        """End the child now, as its owner's decision: what is pending fails, and on_exit is not called."""
        self._closing = True
        self.process.kill()

    def _join(self) -> None:
        self.process.join(60)
        if self.process.is_alive():
            log.warning("the reward model process did not exit in 60 s; killing it")
            self.process.kill()
            self.process.join(5)

    def _resolve(self, message: tuple[int, bool, Any]) -> None:
        call_id, ok, value = message
        future = self._pending.pop(call_id, None)
        if future is not None and not future.done():  # done: the caller went away
            if ok:
                future.set_result(value)
            else:
                future.set_exception(value)

    def _lost(self) -> None:
        """The child's end closed: it exited, was stopped (close) or killed (kill)."""
        self.alive = False
        if self._closing:
            self._fail_pending(ModelUnavailable("the reward model process was stopped before answering"))
        else:
            self._exit = asyncio.get_running_loop().create_task(self._report_exit(), name="verify-rm-exit")

    async def _report_exit(self) -> None:
        await asyncio.to_thread(self.process.join, 5)
        log.error("the reward model process exited (code %s); scoring and updates fail until a restart",
                  self.process.exitcode)
        if self.on_exit is not None:
            self.on_exit()
        self._fail_pending(ModelUnavailable(f"the reward model process exited (code {self.process.exitcode}) before "
                                            "answering"))

    def _fail_pending(self, error: Exception) -> None:
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)


# Frames on the socket pair: an 8-byte big-endian length, then a pickle. Calls are (call_id, function, args), with
# `function` one of RewardCore's (pickled by its qualified name, so the code never crosses), answers
# (call_id, ok, value); None asks the child to exit. The child's first frame is (ok, error): loaded, or why not.
_HEADER = struct.Struct("!Q")


def _frame(message: Any) -> bytes:
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


class _CallLink(asyncio.Protocol):
    """The parent's end: writes frames, and hands each frame it reads to `on_message` (the first to
    `first_message`); `on_lost` when the child's end closes."""

    def __init__(self) -> None:
        self.first_message: asyncio.Future[tuple[bool | None, Any]] = asyncio.get_running_loop().create_future()
        self.on_message: Callable[[Any], None] | None = None
        self.on_lost: Callable[[], None] | None = None
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def write(self, frame: bytes) -> None:
        assert self._transport is not None
        self._transport.write(frame)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            end = _HEADER.size + size
            if len(self._buffer) < end:
                return
            message = pickle.loads(memoryview(self._buffer)[_HEADER.size:end])
            del self._buffer[:end]
            if not self.first_message.done():
                self.first_message.set_result(message)
            elif self.on_message is not None:
                self.on_message(message)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.first_message.done():
            self.first_message.set_result((None, None))
        elif self.on_lost is not None:
            self.on_lost()


class CopiesRunner(Runner):
    """reward.model_copies model processes, each a whole copy of the core. A score goes to the copy with the fewest
    scores in flight; every other operation goes to all copies in the same order (the batcher runs updates, saves and
    swaps exclusively, with no score in flight), and is answered by the first copy, the only one that writes
    checkpoints. After each update the copies' results must be equal: copies that differ would give one request a
    score of another model, so the runner stops as if a model process had died (a restart reloads all from one
    checkpoint)."""

    def __init__(self, copies: list[ProcessRunner]):
        self.copies = copies
        self.alive = True
        self.on_exit: Callable[[], None] | None = None
        self._scoring = [0] * len(copies)
        for copy in copies:
            copy.on_exit = self._copy_exited

    @classmethod
    async def start(cls, config: RewardConfig) -> CopiesRunner:
        # Only the first copy journals and writes checkpoints (periodic saves inside an update included); the others
        # load the same checkpoint and journal at start and make the same updates.
        started = await asyncio.gather(ProcessRunner.start(config),
                                       *(ProcessRunner.start(config, writes=False)
                                         for _ in range(config.model_copies - 1)),
                                       return_exceptions=True)
        copies = [runner for runner in started if isinstance(runner, ProcessRunner)]
        if len(copies) < len(started):
            for copy in copies:
                await copy.close()
            raise next(error for error in started if isinstance(error, BaseException))
        return cls(copies)

    def _copy_exited(self) -> None:
        self._stop_serving("a reward model process exited")

    def _stop_serving(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        log.error("%s; the %d model copies stop serving until a restart", why, len(self.copies))
        for copy in self.copies:
            copy.kill()  # the others too: a partial set would serve, then fail the next update
        if self.on_exit is not None:
            self.on_exit()

    def call(self, operation: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`operation` on every copy; the first copy's answer."""
        loop = asyncio.get_running_loop()
        if not self.alive:
            future: asyncio.Future[T] = loop.create_future()
            future.set_exception(ModelUnavailable("a reward model process has exited; restart the service"))
            return future
        if operation is RewardCore.save or operation is RewardCore.save_if_unsaved:
            return self.copies[0].call(operation, *args)  # one checkpoint: the copies hold the same model
        answers = [copy.call(operation, *args) for copy in self.copies]
        return asyncio.ensure_future(self._first_of_equal(operation, answers))

    async def _first_of_equal(self, operation: Callable[..., Any], answers: list[asyncio.Future[Any]]) -> Any:
        results = await asyncio.gather(*answers)
        if operation is RewardCore.apply_update and any(result != results[0] for result in results[1:]):
            self._stop_serving(f"the model copies differ after an update ({results})")
            raise ModelUnavailable("the reward model copies differ after an update; restart the service, which "
                                   "reloads them from one checkpoint")
        if operation is RewardCore.staged:
            return all(results)
        return results[0]

    def score_tokens(self, token_lists: list[list[int]]) -> asyncio.Future[BatchScores]:
        return self._on_least_busy(lambda copy: copy.score_tokens(token_lists))

    def score_texts(self, texts: list[tuple[str, str, str]]) -> asyncio.Future[BatchScores]:
        return self._on_least_busy(lambda copy: copy.score_texts(texts))

    def _on_least_busy(self,
                       score: Callable[[ProcessRunner], asyncio.Future[BatchScores]]) -> asyncio.Future[BatchScores]:
        """A scoring batch on the copy with the fewest batches in flight (one copy suffices: they are one model)."""
        index = min(range(len(self.copies)), key=self._scoring.__getitem__)
        self._scoring[index] += 1
        future = score(self.copies[index])
        future.add_done_callback(lambda _: self._scoring.__setitem__(index, self._scoring[index] - 1))
        return future

    async def close(self) -> None:
        self.alive = False
        await asyncio.gather(*(copy.close() for copy in self.copies))


async def start_runner(config: RewardConfig) -> Runner:
    """A process runner when config.model_process (reward.model_copies of them), else a thread runner."""
    if config.model_process and config.model_copies > 1:
        return await CopiesRunner.start(config)
    if config.model_process:
        return await ProcessRunner.start(config)
    return await ThreadRunner.start(config)


# ----- the child process -----


def serve_model_process(link: socket.socket, config: RewardConfig, writes: bool, parent_pid: int,
                        log_level: int) -> None:
    """The model process's main (model_process.py starts it): RewardCore here, answering the calls that come over
    `link` until the parent goes."""
    from cooper.runtime.processes import die_with_parent

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # As in every cooper process (cli.py): `kill -USR1 PID` prints this process's stacks to the service's log.
    faulthandler.register(signal.SIGUSR1, file=2, all_threads=True)
    die_with_parent(signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        return
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s[model]: %(message)s")
    try:
        core = RewardCore.load(config, writes)
    except Exception as err:
        link.sendall(_frame((False, _portable(err))))
        return
    link.sendall(_frame((True, None)))
    _serve_calls(link, core)
    core.close()
    # Nothing is left to write but the log (updates are journaled, a background checkpoint has landed), and Python's
    # own teardown of torch took 1-2 s of every reward service stop on 2 cores: skip it.
    logging.shutdown()
    os._exit(0)


def _serve_calls(link: socket.socket, core: RewardCore) -> None:
    """Answer the parent's calls, in order, until it says stop (None) or goes away."""
    incoming = link.makefile("rb")
    while True:
        header = incoming.read(_HEADER.size)
        if len(header) < _HEADER.size:
            return  # the parent is gone
        (size,) = _HEADER.unpack(header)
        payload = incoming.read(size)
        if len(payload) < size:
            return  # the parent went away in the middle of a call
        message = pickle.loads(payload)
        if message is None:
            return
        call_id, operation, args = message
        must_restart = False
        try:
            reply = (call_id, True, operation(core, *args))
        except Exception as err:  # the caller gets it; the model process keeps serving, but see must_restart
            reply = (call_id, False, _portable(err))
            # The core's memory is ahead of its journal and it refuses every call: exiting makes the parent stop the
            # service (on_exit), so that its supervisor restarts it from the journal instead of it refusing forever.
            must_restart = isinstance(err, UnjournaledUpdate)
        try:
            frame = _frame(reply)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            frame = _frame((call_id, False, RuntimeError(f"{operation.__name__}: the result did not pickle: {err}")))
        link.sendall(frame)
        if must_restart:
            return


def _portable(err: Exception) -> Exception:
    """The exception itself when it pickles, else a RuntimeError that keeps its type name and message."""
    try:
        pickle.loads(pickle.dumps(err))
        return err
    except Exception:
        return RuntimeError(f"{type(err).__name__}: {err}")

"""A pool of verifier worker processes with a hard per-item timeout.

Why processes: math-verify's timeouts need a main thread, and sympy can hold the GIL for minutes. Why our own pool
instead of concurrent.futures: a stuck worker must be killed and replaced without losing the rest of its batch,
which ProcessPoolExecutor cannot do (it breaks the whole pool).

Each worker slot is driven by one thread in the server process. A batch is cut into chunks that go on a shared
queue, so idle workers take the next chunk (a chunk keeps the per-item IPC cost low). A worker sends back each
item's result as soon as it has it; the driver waits at most `timeout_s * 1.5` for the next one. The worker's own
timer (rules.py) normally answers TIMEOUT at `timeout_s`; when it does not (stuck in C code), the driver kills it,
records TIMEOUT for that item, puts the rest of the chunk back on the queue and starts a new worker.

A caller may go away while its batch is being checked (a gRPC call cancelled by a client that died): its future is
then cancelled, the chunks still queued for it are dropped, and results that come back for it are discarded. A
driver thread never dies from one chunk: an unexpected error fails that chunk's batch, the worker is replaced (its
pipe may hold the rest of the chunk's answers), and the slot goes on. Should a slot's thread die anyway, `serving`
says whether any slot is left, and `on_lost` is called when none is: a pool with no slot would accept calls and never
answer them.
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import prometheus_client

from cooper.services.verifier.messages import Check, Verdict

log = logging.getLogger("cooper.verifier.pool")

WORKER_RESTARTS = prometheus_client.Counter("cooper_verifier_worker_restarts", "Workers killed and replaced", ["why"])
VERDICTS = prometheus_client.Counter("cooper_verifier_verdicts", "Items checked, by verdict", ["verdict"])
ITEM_SECONDS = prometheus_client.Histogram(
    "cooper_verifier_item_seconds", "Time to check one item inside its worker",
    buckets=(0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1, 3, 10),
)

HARD_TIMEOUT_FACTOR = 1.5  # the kill comes after the worker's own timer had its chance, within 2x the timeout
WARM_UP = [("\\boxed{1}", "1"), ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}"), ("\\boxed{x=3}", "(x+1)^2"),
           ("The answer is (-\\infty, 3)", "\\{1,2\\}"), ("#### 72", "3\\pi/2")]


def _worker_main(conn: Connection, timeout_s: float, max_chars: int, answer: str) -> None:
    """Worker loop: receive a chunk [(position, completion, reference)], send one (position, Check) per item."""
    # Only the workers check: the serving process never imports math-verify (a second or more of its start-up on
    # 2 cores); the forkserver has it imported once for every worker it forks.
    from cooper.services.verifier.rules import ReferenceCache, check

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent owns Ctrl-C and shutdown
    cache = ReferenceCache()
    for completion, reference in WARM_UP:  # math-verify builds parsers lazily: pay for it before real items
        check(completion, reference, timeout_s, max_chars)
    conn.send("ready")  # start-up and warm-up must not count against the first item's time limit
    while True:
        try:
            chunk = conn.recv()
        except EOFError:
            return
        if chunk is None:
            return
        for position, completion, reference in chunk:
            conn.send((position, check(completion, reference, timeout_s, max_chars, cache, answer)))


@dataclass
class _Batch:
    items: list[tuple[str, str]]
    results: list[Check | None]
    future: Future[list[Check]] = field(default_factory=Future)
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, position: int, result: Check) -> None:
        VERDICTS.labels(result.verdict.name).inc()
        ITEM_SECONDS.observe(result.ms / 1000.0)
        with self.lock:
            self.results[position] = result
            self.remaining -= 1
            done = self.remaining == 0
        if done:
            self.settle(result=[r for r in self.results if r is not None])

    @property
    def abandoned(self) -> bool:
        """The caller went away (its future was cancelled): nothing more is worth checking for it."""
        return self.future.cancelled()

    def settle(self, result: list[Check] | None = None, error: BaseException | None = None) -> None:
        """Complete the future unless it is done already (cancelled by a caller that went away, or failed)."""
        try:
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result or [])
        except InvalidStateError:  # cancelled since the last look: nobody waits for it
            pass


@dataclass
class _Chunk:
    batch: _Batch
    positions: list[int]


class _Worker:
    def __init__(self, ctx: Any, timeout_s: float, max_chars: int, answer: str):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, timeout_s, max_chars, answer), daemon=True)
        self.process.start()
        child.close()
        self.ready = False

    def wait_ready(self, timeout_s: float = 120.0) -> bool:
        """Wait for the worker's "ready" (sent after its warm-up); False if it died or never said it."""
        if self.ready:
            return True
        try:
            self.ready = self.conn.poll(timeout_s) and self.conn.recv() == "ready"
        except (EOFError, OSError):
            self.ready = False
        return self.ready

    def kill(self) -> None:
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(timeout=2)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


class PoolLost(RuntimeError):
    """Every worker slot of the pool is gone: the pool cannot check anything until the service restarts."""


class VerifierPool:
    """`submit(items)` -> Future of one Check per (completion, reference) item, in order. Thread-safe.

    `on_lost(reason)` is called once, from the thread that found it, when no worker slot is left."""

    def __init__(self, workers: int | None = None, timeout_s: float = 3.0, chunk_size: int = 16, max_chars: int = 20000,
                 answer: str = "anywhere", on_lost: Callable[[str], None] | None = None):
        self.workers = workers or os.cpu_count() or 1
        self.on_lost = on_lost
        self.lost: str | None = None
        """Why no slot is left; None while any slot serves."""
        self._live_slots = self.workers
        self._slots_lock = threading.Lock()
        self.timeout_s = timeout_s
        self.chunk_size = chunk_size
        self.max_chars = max_chars
        self.answer = answer
        # forkserver: workers start as forks of a clean process that already imported math-verify, so a killed
        # worker is replaced in milliseconds, and never as a fork of the threaded gRPC server.
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(["cooper.services.verifier.rules", "cooper.services.verifier.pool"])
        self._queue: queue.Queue[_Chunk | None] = queue.Queue()
        self._closed = False
        self._slots = [_Worker(self._ctx, timeout_s, max_chars, answer) for _ in range(self.workers)]
        if not all(worker.wait_ready() for worker in self._slots):  # serve only once every worker is warm
            for worker in self._slots:
                worker.kill()
            raise RuntimeError("verifier worker processes failed to start; see the log above")
        self._threads = [
            threading.Thread(target=self._drive, args=(i,), name=f"verifier-slot-{i}", daemon=True)
            for i in range(self.workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def serving(self) -> bool:
        """At least one worker slot is driven by a live thread (health: a pool without one cannot answer)."""
        return self.lost is None

    def submit(self, items: list[tuple[str, str]]) -> Future[list[Check]]:
        if self._closed:
            raise RuntimeError("the verifier pool is closed")
        if self.lost is not None:
            raise PoolLost(self.lost)
        batch = _Batch(items=items, results=[None] * len(items), remaining=len(items))
        if not items:
            batch.future.set_result([])
            return batch.future
        # Enough chunks that every worker gets some, few enough that IPC stays cheap.
        size = max(1, min(self.chunk_size, math.ceil(len(items) / (2 * self.workers))))
        for start in range(0, len(items), size):
            self._queue.put(_Chunk(batch, list(range(start, min(start + size, len(items))))))
        return batch.future

    @property
    def worker_pids(self) -> list[int | None]:
        """Process ids of the current workers, one per slot (they change when a worker is replaced)."""
        return [worker.process.pid for worker in self._slots]

    def check_all(self, items: list[tuple[str, str]]) -> list[Check]:
        return self.submit(items).result()

    def close(self) -> None:
        """Finish queued work, then stop every worker."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        for worker in self._slots:
            worker.close()

    def _replace(self, slot: int, why: str) -> None:
        WORKER_RESTARTS.labels(why).inc()
        self._slots[slot].kill()
        self._slots[slot] = _Worker(self._ctx, self.timeout_s, self.max_chars, self.answer)

    def _drive(self, slot: int) -> None:
        try:
            while True:
                chunk = self._queue.get()
                if chunk is None:
                    return
                if chunk.batch.abandoned:
                    continue
                try:
                    self._run_chunk(slot, chunk)
                except Exception as err:  # a bug or a failed restart must cost one batch, not the slot
                    log.exception("verifier slot %d failed on a chunk; the batch fails and the worker is replaced",
                                  slot)
                    chunk.batch.settle(error=err)
                    self._replace(slot, "error")
        except BaseException as err:  # the thread ends here: say so, and whether any slot is left
            self._slot_died(slot, err)

    def _slot_died(self, slot: int, err: BaseException) -> None:
        """A slot's thread is ending on an error: when it was the last one, fail what waits and tell `on_lost`."""
        log.error("verifier slot %d stopped", slot, exc_info=err)
        with self._slots_lock:
            self._live_slots -= 1
            if self._live_slots > 0 or self._closed:
                return
        self.lost = f"every verifier worker slot has stopped (the last on {err!r}); restart the service"
        while True:  # nobody is left to take these: their callers get the error now, not at their deadline
            try:
                chunk = self._queue.get_nowait()
            except queue.Empty:
                break
            if chunk is not None:
                chunk.batch.settle(error=PoolLost(self.lost))
        if self.on_lost is not None:
            self.on_lost(self.lost)

    def _run_chunk(self, slot: int, chunk: _Chunk) -> None:
        batch, pending = chunk.batch, list(chunk.positions)
        worker = self._slots[slot]
        if not worker.wait_ready():
            self._replace(slot, "dead")
            self._queue.put(chunk)
            return
        try:
            worker.conn.send([(p, *batch.items[p]) for p in pending])
        except (BrokenPipeError, OSError):
            self._replace(slot, "dead")
            self._queue.put(chunk)
            return
        hard_timeout = self.timeout_s * HARD_TIMEOUT_FACTOR
        why = ""
        while pending:
            started = time.perf_counter()
            try:
                ready = worker.conn.poll(hard_timeout)
                message = worker.conn.recv() if ready else None
            except (EOFError, OSError):
                current = pending.pop(0)
                why = "dead"
                log.warning("verifier worker died on an item; replacing it")
                batch.record(current, Check(Verdict.ERROR, detail="the worker process died on this item"))
                break
            if message is None:
                current = pending.pop(0)
                why = "stuck"
                log.warning("verifier worker stuck past %.1f s; killing and replacing it", hard_timeout)
                ms = (time.perf_counter() - started) * 1000.0
                batch.record(current, Check(Verdict.TIMEOUT, ms=ms, detail=f"worker killed after {hard_timeout:g} s"))
                break
            position, result = message
            pending.remove(position)
            batch.record(position, result)
        else:
            return
        # The worker is dead or stuck: replace it, and let any free worker take the rest of the chunk.
        self._replace(slot, why)
        if pending:
            self._queue.put(_Chunk(batch, pending))

"""Dynamic batching of scoring requests in front of the model runner (runner.py).

Requests from gRPC and HTTP queue here (as token ids, or as texts where the model's process tokenizes); one asyncio
task cuts FIFO batches by count and by wait time and submits each to the runner, which cuts it further into
forward passes by a token budget (RewardCore.score_tokens). Updates and saves enter the same queue as exclusive
jobs. The runner runs what it is given one job at a time in submission order, so a score never sees half-updated
weights, and because a request's items are queued together and the queue is FIFO, all items of one request come
from the same model version.

Pipelining: up to `batching.max_inflight` jobs per model copy are submitted at once (default 2: one running, the
next waiting at the model), so each copy starts its next batch the moment it finishes one instead of idling through a
round trip to this loop. A batch is still cut as late as possible: when a slot frees, from everything that has arrived.

Spreading (`batching.spread`, on where the service chose the batch): a batch holds at most the items outstanding
(waiting and in flight) over the batch slots, rounded up. With 32 one-item clients, 2 copies and 3 slots each, that is
6: cutting to the full max batch instead put all 32 in one batch on one copy, waited max_wait_ms for a batch that
never filled, and left the other copy idle (0.75 of the swept best at the chosen batch 128 on an idle 2-core EPYC).

Admission control: at most `max_queue` items wait (beyond: QueueFull, with a retry hint); an item that waited
longer than `queue_timeout_s` fails with QueueTimeout instead of being scored late; a request whose caller went
away (cancelled future) is dropped without running the model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

import prometheus_client

from cooper.config import BatchingConfig

T = TypeVar("T")
log = logging.getLogger("cooper.reward.batcher")

QUEUE_SECONDS = prometheus_client.Histogram(
    "cooper_reward_queue_seconds", "Time a scoring request waited before its last batch started",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
BATCH_SECONDS = prometheus_client.Histogram(
    "cooper_reward_batch_seconds",
    "Time from submitting a scoring batch to the model until its logits are back (forward passes, and "
    "waiting behind the job submitted before it)",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
BATCH_ITEMS = prometheus_client.Histogram(
    "cooper_reward_batch_items", "Items per scoring batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
)
QUEUED_ITEMS = prometheus_client.Gauge("cooper_reward_queued_items", "Scoring items waiting for the model")
REJECTED = prometheus_client.Counter("cooper_reward_rejected_total", "Scoring requests refused", ["reason"])


class QueueFull(Exception):
    """The queue holds max_queue items; retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QueueTimeout(Exception):
    """A request waited longer than queue_timeout_s and was not scored."""


class RequestTooLarge(Exception):
    """A request holds more items than the queue can ever admit."""


# run_batch(items) submits a batch to the model *before it returns* (so that submission order is model order) and
# gives an awaitable of (one result per item, in order: its logit, or its logit and token count; the model version
# that produced them).
RunBatch = Callable[[list[Any]], Awaitable[tuple[list[Any], int]]]


@dataclass(eq=False)
class _Request:
    items: Sequence[Any]
    future: asyncio.Future[tuple[list[Any], int]]
    enqueued: float
    next_item: int = 0  # items before this one are in a batch already
    done_items: int = 0
    results: list[Any] = field(default_factory=list)
    version: int | None = None


@dataclass(eq=False)
class _Exclusive:
    submit: Callable[[], Awaitable[Any]]  # like RunBatch: submits when called
    future: asyncio.Future[Any]


class Batcher:
    """Start with `start()` inside the event loop; `submit` scores, `run_exclusive` runs a model job alone."""

    def __init__(self, run_batch: RunBatch, config: BatchingConfig, model_copies: int = 1,
                 waits_ms: list[float] | None = None):
        """`model_copies`: the model processes run_batch spreads batches over; each gets max_inflight of them.
        `waits_ms`: with spreading, how long the head request may wait for a batch cut to each size (index: items)
        instead of max_wait_ms for all (serving_defaults.spread_waits: a share of that batch's own pass)."""
        self.run_batch = run_batch
        self.config = config
        self.waits_ms = waits_ms if config.spread and waits_ms else None  # GET /v1/model shows it
        # Jobs submitted to the model and not yet answered. Per copy: with one slot per copy (2 copies, 2 slots) each
        # copy idled through every round trip to this loop, a third of its time at 1,300 items/s on 2 cores.
        self._slot_count = config.max_inflight * model_copies
        self._slots = asyncio.Semaphore(self._slot_count)
        self._inflight: set[asyncio.Task[None]] = set()
        self._queue: deque[_Request | _Exclusive] = deque()
        self._queued_items = 0
        self._arrived = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._items_per_s = 0.0  # moving average, for Retry-After hints
        self.on_loop_died: Callable[[str], None] | None = None
        """Called when the loop ends on an error (a bug): every later request would fail, so the service must stop
        and be restarted rather than report itself healthy."""

    @property
    def queued_items(self) -> int:
        return self._queued_items

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="reward-batcher")
        self._task.add_done_callback(self._loop_ended)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():  # stop()
            return
        error = task.exception()
        log.error("the reward batching loop ended on an error; the service cannot score", exc_info=error)
        self._fail_waiting("the scoring loop stopped; the service is restarting")  # nobody is left to take these
        if self.on_loop_died is not None:
            self.on_loop_died(f"the reward batching loop ended on {error!r}")

    async def stop(self) -> None:
        """Fail what still waits, stop the loop, and wait for the jobs the model has to finish."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._fail_waiting("the reward service is shutting down")
        await asyncio.gather(*self._inflight, return_exceptions=True)

    def _fail_waiting(self, why: str) -> None:
        """Fail every job still in the queue with QueueTimeout(why)."""
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(QueueTimeout(why))
        self._queued_items = 0

    async def submit(self, items: Sequence[Any]) -> tuple[list[Any], int]:
        """Results of `items` in order, and the one model version that produced all of them."""
        if not self.running:
            raise QueueTimeout("the scoring loop is not running (the service is starting or stopping)")
        if len(items) > self.config.max_queue:
            REJECTED.labels("too_large").inc()
            raise RequestTooLarge(
                f"{len(items)} items is more than reward.batching.max_queue={self.config.max_queue}; split the request"
            )
        if self._queued_items + len(items) > self.config.max_queue:
            REJECTED.labels("queue_full").inc()
            retry_after_s = self._retry_after()
            raise QueueFull(f"scoring queue full ({self._queued_items} items waiting, max {self.config.max_queue}); "
                            f"retry after {retry_after_s} s", retry_after_s)
        future: asyncio.Future[tuple[list[Any], int]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(items, future, time.monotonic(), results=[None] * len(items)))
        self._queued_items += len(items)
        QUEUED_ITEMS.set(self._queued_items)
        self._arrived.set()
        return await future

    async def run_exclusive(self, submit: Callable[[], Awaitable[T]]) -> T:
        """Submit a model job (submit() must submit it before returning) after every request queued before it,
        and before any queued after it; its result."""
        if not self.running:
            raise QueueTimeout("the scoring loop is not running (the service is starting or stopping)")
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue.append(_Exclusive(submit, future))
        self._arrived.set()
        return await future

    def _retry_after(self) -> int:
        if self._items_per_s <= 0:
            return 1
        return max(1, math.ceil(self._queued_items / self._items_per_s))

    # ----- the loop -----

    async def _loop(self) -> None:
        while True:
            if not self._queue:
                self._arrived.clear()
                await self._arrived.wait()
                continue
            head = self._queue[0]  # only this loop removes jobs, so the head stays the head across awaits
            if isinstance(head, _Exclusive):
                await self._slots.acquire()
                self._queue.popleft()
                self._start(self._run_exclusive(head, self._submitted(head.submit)))
                continue
            await self._wait_for_batch(head)
            await self._slots.acquire()
            batch = self._take_batch()
            if not batch:
                self._slots.release()
                continue
            items = [request.items[index] for request, index in batch]
            self._start(self._run_scoring(batch, time.perf_counter(), self._submitted(partial(self.run_batch, items))))

    @staticmethod
    def _submitted(submit: Callable[[], Awaitable[T]]) -> Awaitable[T]:
        """submit() now, in queue order; an error raised while submitting is delivered through the awaitable."""
        try:
            return submit()
        except Exception as err:
            failed: asyncio.Future[T] = asyncio.get_running_loop().create_future()
            failed.set_exception(err)
            return failed

    def _start(self, job: Awaitable[None]) -> None:
        """Await a submitted job in a task of its own; its slot is released when it is answered."""

        async def run() -> None:
            try:
                await job
            finally:
                self._slots.release()

        task = asyncio.get_running_loop().create_task(run())
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    async def _run_exclusive(self, job: _Exclusive, pending: Awaitable[Any]) -> None:
        try:
            result = await pending
        except Exception as err:  # the caller gets the error; the loop keeps serving
            if not job.future.done():
                job.future.set_exception(err)
            return
        if not job.future.done():
            job.future.set_result(result)

    def _batch_target(self) -> int:
        """The most items the next batch takes: max_batch_size, or with spreading the items outstanding (queued and
        in flight: _queued_items counts both) shared over the slots, rounded up."""
        if not self.config.spread:
            return self.config.max_batch_size
        return max(1, min(self.config.max_batch_size, math.ceil(self._queued_items / self._slot_count)))

    async def _wait_for_batch(self, head: _Request) -> None:
        """Wait until a full batch waits or the head request has waited max_wait_ms (with waits_ms: the wait of
        the batch size spreading targets now, which grows as requests arrive)."""
        while self._pending_items_before_exclusive() < (target := self._batch_target()):
            wait_ms = self.config.max_wait_ms if self.waits_ms is None else self.waits_ms[target]
            remaining = head.enqueued + wait_ms / 1000 - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), remaining)
            except asyncio.TimeoutError:  # not the builtin before Python 3.11
                return

    def _pending_items_before_exclusive(self) -> int:
        count = 0
        for job in self._queue:
            if isinstance(job, _Exclusive):
                break
            count += len(job.items) - job.next_item
            if count >= self.config.max_batch_size:
                break
        return count

    def _take_batch(self) -> list[tuple[_Request, int]]:
        """Pop up to _batch_target() items from the head of the queue."""
        now = time.monotonic()
        target = self._batch_target()
        batch: list[tuple[_Request, int]] = []
        while self._queue and isinstance(self._queue[0], _Request):
            request = self._queue[0]
            if self._drop_if_abandoned(request, now):
                continue
            while request.next_item < len(request.items):
                if len(batch) >= target:
                    return batch
                batch.append((request, request.next_item))
                request.next_item += 1
            self._queue.popleft()
            QUEUE_SECONDS.observe(now - request.enqueued)
        return batch

    def _drop_if_abandoned(self, request: _Request, now: float) -> bool:
        """Drop the head request's items not yet in a batch when nobody waits for them: its caller went away (its
        future cancelled) or already has an answer (an error from one of its batches), even part-way through it, so
        that a dead caller's 3,000 items stop taking the model from the callers behind it; or it waited past
        queue_timeout_s before any of its items were taken (then it fails with QueueTimeout)."""
        stale = request.next_item == 0 and now - request.enqueued > self.config.queue_timeout_s
        if not (stale or request.future.done()):
            return False
        self._queue.popleft()
        self._queued_items -= len(request.items) - request.next_item  # those in a batch are counted off as answered
        QUEUED_ITEMS.set(self._queued_items)
        if stale and not request.future.done():
            REJECTED.labels("queue_timeout").inc()
            request.future.set_exception(QueueTimeout(
                f"waited {now - request.enqueued:.1f} s in the scoring queue (reward.batching.queue_timeout_s="
                f"{self.config.queue_timeout_s}); the service is overloaded, retry later"
            ))
        return True

    async def _run_scoring(self, batch: list[tuple[_Request, int]], start: float,
                           pending: Awaitable[tuple[list[Any], int]]) -> None:
        try:
            results, version = await pending
        except Exception as err:
            self._finish(batch, error=err)
            return
        elapsed = time.perf_counter() - start
        BATCH_SECONDS.observe(elapsed)
        BATCH_ITEMS.observe(len(batch))
        rate = len(batch) / max(elapsed, 1e-6)
        self._items_per_s = rate if self._items_per_s == 0 else 0.9 * self._items_per_s + 0.1 * rate
        mixed = [request for request, _ in batch if request.version not in (None, version)]
        if mixed:  # FIFO makes this impossible; fail loudly rather than answer with two versions
            self._finish(batch, error=RuntimeError("a request's items came from two model versions"))
            return
        for (request, index), result in zip(batch, results, strict=True):
            request.results[index] = result
            request.version = version
        self._finish(batch)

    def _finish(self, batch: list[tuple[_Request, int]], error: Exception | None = None) -> None:
        for request, _ in batch:
            request.done_items += 1
            self._queued_items -= 1
            if request.future.done():
                continue
            if error is not None:
                request.future.set_exception(error)
            elif request.done_items == len(request.items):
                assert request.version is not None
                request.future.set_result((request.results, request.version))
        QUEUED_ITEMS.set(self._queued_items)

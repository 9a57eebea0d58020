"""The worker pool on its own: a hung or dead worker is replaced without losing the rest of its batch."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cooper.services.verifier.pool import PoolLost, VerifierPool
from cooper.services.verifier.rules import Verdict


@pytest.fixture
def pool():
    p = VerifierPool(workers=1, timeout_s=1, chunk_size=64)
    yield p
    p.close()


def _slow_items(n: int) -> list[tuple[str, str]]:
    # Each check takes a few ms; enough of them keep the worker busy while the test interferes.
    return [(f"We get {k} + 1 = {k + 1}. The answer is \\boxed{{{k + 1}}}.", str(k + 1)) for k in range(n)]


def test_a_hung_worker_is_killed_and_replaced(pool):
    before = pool.worker_pids
    future = pool.submit(_slow_items(200))
    time.sleep(0.05)
    os.kill(before[0], signal.SIGSTOP)  # hangs like a computation stuck in C code: no signal handler runs
    start = time.perf_counter()
    results = future.result(timeout=30)
    assert len(results) == 200
    killed = [r for r in results if r.verdict == Verdict.TIMEOUT]
    assert len(killed) == 1 and "killed" in killed[0].detail
    assert killed[0].ms <= 2 * pool.timeout_s * 1000
    assert all(r.verdict == Verdict.CORRECT for r in results if r is not killed[0])
    assert time.perf_counter() - start < 10
    assert pool.worker_pids != before


def test_a_dead_worker_is_replaced_and_its_item_is_an_error(pool):
    before = pool.worker_pids
    future = pool.submit(_slow_items(200))
    time.sleep(0.05)
    os.kill(before[0], signal.SIGKILL)
    results = future.result(timeout=30)
    errors = [r for r in results if r.verdict == Verdict.ERROR]
    assert len(errors) <= 1  # the item it was on (none if it died between items)
    assert all(r.verdict == Verdict.CORRECT for r in results if r.verdict != Verdict.ERROR)
    assert pool.worker_pids != before
    assert pool.check_all([("\\boxed{2}", "2")])[0].verdict == Verdict.CORRECT


def test_concurrent_batches_keep_their_order():
    pool = VerifierPool(workers=2, timeout_s=2, chunk_size=4)
    try:
        a = pool.submit([(f"\\boxed{{{k}}}", str(k)) for k in range(30)])
        b = pool.submit([(f"\\boxed{{{k}}}", str(k + 1)) for k in range(30)])
        assert all(r.verdict == Verdict.CORRECT for r in a.result(timeout=30))
        assert all(r.verdict == Verdict.INCORRECT for r in b.result(timeout=30))
        assert [r.extracted for r in b.result()] == [str(k) for k in range(30)]
    finally:
        pool.close()


def test_a_caller_that_goes_away_leaves_the_slot_serving(pool):
    """The caller's future is cancelled while its chunk is in the only worker (a gRPC call whose client died): the
    worker's results for it are discarded, the rest of its chunks are dropped, and the next batch is answered."""
    gone = pool.submit(_slow_items(200))
    time.sleep(0.05)  # the first chunk is in the worker
    assert gone.cancel()
    started = time.perf_counter()
    assert [r.verdict for r in pool.submit([("\\boxed{2}", "2")]).result(timeout=30)] == [Verdict.CORRECT]
    # Only what was in the worker is finished first (about a chunk of 64 at a few ms each), not the 200 items.
    assert time.perf_counter() - started < 5


def test_an_item_that_cannot_be_sent_fails_its_batch_only(pool):
    """An unexpected error inside a slot's loop (here: an item that does not pickle) fails that batch; the slot
    replaces its worker and goes on."""
    before = pool.worker_pids
    bad = pool.submit([(lambda: None, "1")])  # type: ignore[list-item]
    with pytest.raises(Exception, match="pickle"):
        bad.result(timeout=30)
    assert [r.verdict for r in pool.submit([("\\boxed{2}", "2")]).result(timeout=30)] == [Verdict.CORRECT]
    assert pool.worker_pids != before
    assert pool.serving


class _SlotKiller(BaseException):
    """Ends a slot's thread the way nothing inside the loop may catch."""


def test_a_pool_with_no_slot_left_says_so_and_fails_what_waits(monkeypatch):
    lost: list[str] = []
    pool = VerifierPool(workers=1, timeout_s=1, chunk_size=4, on_lost=lost.append)
    try:
        def die(slot, chunk):
            raise _SlotKiller("the slot's thread ends")

        monkeypatch.setattr(pool, "_run_chunk", die)
        first = pool.submit([("\\boxed{1}", "1")] * 8)  # two chunks: one kills the slot, one is left queued
        with pytest.raises(PoolLost, match="every verifier worker slot has stopped"):
            first.result(timeout=10)
        assert not pool.serving
        assert len(lost) == 1 and "restart the service" in lost[0]
        with pytest.raises(PoolLost):
            pool.submit([("\\boxed{1}", "1")])
    finally:
        pool.close()

"""The worker pool on its own: a hung or dead worker is replaced without losing the rest of its batch."""

from __future__ import annotations

import os
import signal
import time

import pytest

from cooper.services.verifier.pool import VerifierPool
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

"""The reward service core: batcher, versions, idempotent updates, checkpoints and restart (real tiny model)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.config import BatchingConfig
from cooper.runtime import checkpoint
from cooper.runtime.checkpoint import REWARD
from cooper.runtime.ledger import idempotency_key
from cooper.services.reward.batcher import QueueFull, QueueTimeout, RequestTooLarge
from cooper.services.reward.service import RewardService
from cooper.services.reward.verify_rm import plan_batches


def test_idempotent_update_replays_and_trains_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path))
        items = tiny_items(4)
        pairs = tiny_pairs(2)
        first = await service.update(idempotency_key("run-a", 3), pairs)
        after_first = await service.score(items)
        again = await service.update(idempotency_key("run-a", 3), pairs)
        assert again.replayed and not first.replayed
        assert (again.loss, again.grad_norm, again.version) == (first.loss, first.grad_norm, first.version)
        assert (await service.score(items)).logits == after_first.logits  # nothing trained
        assert service.core.rm.version == 1 and service.info().last_key == "run-a/3"
        # Another step, or the same step of another run, trains.
        assert (await service.update(idempotency_key("run-a", 4), pairs)).version == 2
        assert (await service.update(idempotency_key("run-b", 3), pairs)).version == 3
        # No run id: no idempotency.
        assert (await service.update("", pairs)).version == 4
        assert (await service.update("", pairs)).version == 5
        await service.stop()

    asyncio.run(main())


def test_an_update_may_ask_for_more_optimizer_steps_than_the_configured_ones(tmp_path: Path) -> None:
    # What the alarm's rm_negatives action sends: optimizer_steps=3 trains exactly as reward.update_steps=3 does,
    # and differently from the configured single step.
    async def logits_after(config_steps: int, asked: int, where: str) -> list[float]:
        service = await RewardService.create(make_config(tmp_path / where, update_steps=config_steps))
        result = await service.update(idempotency_key("run", 0), tiny_pairs(4), asked)
        assert result.version == 1 and not result.skipped
        logits = (await service.score(tiny_items(6))).logits
        await service.stop()
        return logits

    asked, configured, default = (asyncio.run(logits_after(steps, asked, where)) for steps, asked, where in
                                  ((1, 3, "asked"), (3, 0, "configured"), (1, 0, "default")))
    assert max(abs(a - b) for a, b in zip(asked, configured, strict=True)) <= 1e-6
    assert max(abs(a - b) for a, b in zip(asked, default, strict=True)) > 1e-4


def test_checkpoint_restart_resumes_version_scores_optimizer_and_keys(tmp_path: Path) -> None:
    config = make_config(tmp_path, save_on_stop=False)
    items = tiny_items(6)
    pairs = tiny_pairs(4)

    async def main() -> None:
        first = await RewardService.create(config)
        await first.update(idempotency_key("run", 1), pairs)
        recorded = await first.update(idempotency_key("run", 2), pairs)
        saved = await first.save("step-2")
        assert saved.version == 2 and Path(saved.path).name == "v00000002-u00000002"
        assert first.info().checkpoint == saved.path
        scores = await first.score(items)

        second = await RewardService.create(config)
        assert second.core.rm.version == 2 and second.info().last_key == "run/2"
        assert (await second.score(items)).logits == scores.logits  # bit for bit
        replay = await second.update(idempotency_key("run", 2), pairs)
        assert replay.replayed and replay.loss == recorded.loss and second.core.rm.version == 2
        # The optimizer state came back too: the next step is the same step in both.
        a = await first.update(idempotency_key("run", 3), pairs)
        b = await second.update(idempotency_key("run", 3), pairs)
        assert (a.loss, a.grad_norm, a.version) == (b.loss, b.grad_norm, b.version)
        assert (await first.score(items)).logits == (await second.score(items)).logits
        await first.stop()
        await second.stop()

    asyncio.run(main())


def test_the_replay_of_recent_pairs_is_trained_on_and_survives_a_restart(tmp_path: Path) -> None:
    config = make_config(tmp_path, save_on_stop=False, replay_updates=2)
    items = tiny_items(6)
    steps = [tiny_pairs(3, seed=s) for s in range(4)]

    async def main() -> None:
        first = await RewardService.create(config)
        for step in range(3):
            await first.update(idempotency_key("run", step), steps[step])
        assert [len(update) for update in first.core._replay] == [3, 3]  # the newest two updates only
        await first.save()
        second = await RewardService.create(config)
        without = await RewardService.create(make_config(tmp_path, save_on_stop=False))  # same checkpoint, no replay
        a = await first.update(idempotency_key("run", 3), steps[3])
        b = await second.update(idempotency_key("run", 3), steps[3])
        c = await without.update(idempotency_key("run", 3), steps[3])
        assert (await first.score(items)).logits == (await second.score(items)).logits  # the replay came back
        assert (a.grad_norm, a.loss) == (b.grad_norm, b.loss)
        # Same fresh pairs (their loss equal up to the order of float sums), a different step.
        assert a.loss == pytest.approx(c.loss, rel=1e-6) and a.grad_norm != c.grad_norm
        for service in (first, second, without):
            await service.stop()

    asyncio.run(main())


def test_checkpoints_are_atomic_pruned_and_saved_on_stop(tmp_path: Path) -> None:
    config = make_config(tmp_path, keep_checkpoints=2, save_every=2)
    root = Path(config.checkpoint_dir)
    root.mkdir(parents=True)
    (root / ".tmp-crashed").mkdir()  # a save that died half-way
    (root / "v00000009-u00000009").mkdir()  # no state file: incomplete, never picked

    async def main() -> None:
        service = await RewardService.create(config)
        assert service.core.rm.version == 0  # neither leftover was loaded
        assert not (root / ".tmp-crashed").exists()
        for step in range(5):
            await service.update(idempotency_key("run", step), tiny_pairs(2))
        await service.stop()  # version 5 is unsaved: save_on_stop writes it

    asyncio.run(main())
    names = [path.name for path in checkpoint.complete_checkpoints(root, REWARD)]
    assert names == ["v00000004-u00000004", "v00000005-u00000005"]  # every 2 updates, on stop, keep 2
    assert checkpoint.read_state(root / names[-1], REWARD)["tag"] == "stop"


def test_scores_never_mix_versions_while_updates_run(tmp_path: Path) -> None:
    """Concurrent scoring and updates: each answer's logits are exactly those of the version it names."""
    config = make_config(tmp_path)
    items = tiny_items(6)

    async def main() -> None:
        service = await RewardService.create(config)
        reference = {0: (await service.score(items)).logits}

        rm = service.core.rm

        async def updates() -> None:
            for step in range(3):
                await service.update(idempotency_key("run", step), tiny_pairs(2))
                # On the model thread, between batches: exactly the weights of the version it names.
                version, logits = await service.batcher.run_exclusive(
                    lambda: service.runner.run(lambda: (rm.version, rm.logits(rm.encode(items)))))
                reference[version] = logits

        answers = []

        async def scores() -> None:
            for _ in range(12):
                answers.append(await service.score(items))
                await asyncio.sleep(0.01)

        await asyncio.gather(updates(), scores(), scores())
        await service.stop()
        assert len({a.version for a in answers}) >= 2  # scoring really overlapped the updates
        for answer in answers:
            expected = reference[answer.version]
            assert max(abs(x - y) for x, y in zip(answer.logits, expected, strict=True)) <= 1e-5

    asyncio.run(main())


def test_batcher_refuses_when_full_and_fails_stale_requests(tmp_path: Path) -> None:
    config = make_config(tmp_path, batching=BatchingConfig(max_queue=4, queue_timeout_s=0.2, max_wait_ms=1))
    items = tiny_items(3)

    async def main() -> None:
        service = await RewardService.create(config)
        gate = threading.Event()
        # Two blockers fill both pipeline slots (one job running, one submitted behind it), so the next request
        # waits in the queue, where staleness is checked.
        blockers = [asyncio.ensure_future(service.batcher.run_exclusive(lambda: service.runner.run(gate.wait, 10)))
                    for _ in range(2)]
        waiting = asyncio.ensure_future(service.score(items))  # 3 items queued behind the blockers
        await asyncio.sleep(0.05)
        assert service.batcher.queued_items == 3
        with pytest.raises(QueueFull) as full:
            await service.score(items[:2])  # 3 + 2 > 4
        assert full.value.retry_after_s >= 1
        with pytest.raises(RequestTooLarge):
            await service.score(tiny_items(5))  # could never fit
        await asyncio.sleep(0.3)  # past queue_timeout_s
        gate.set()
        await asyncio.gather(*blockers)
        with pytest.raises(QueueTimeout):
            await waiting
        assert service.batcher.queued_items == 0
        assert len((await service.score(items)).logits) == 3  # serving again
        await service.stop()

    asyncio.run(main())


def test_a_batching_loop_that_dies_fails_what_waits_and_says_so(tmp_path: Path, monkeypatch) -> None:
    """A bug that ends the loop must not leave requests waiting for their deadline behind a healthy-looking service:
    they fail at once, readiness drops, and on_loop_died (the server's fail(): exit, to be restarted) is called."""

    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path))
        died: list[str] = []
        service.batcher.on_loop_died = died.append

        def bug() -> list:
            raise RuntimeError("a bug in batch cutting")

        monkeypatch.setattr(service.batcher, "_take_batch", bug)
        with pytest.raises(QueueTimeout, match="scoring loop stopped"):
            await asyncio.wait_for(service.score(tiny_items(2)), 10)
        assert len(died) == 1 and "a bug in batch cutting" in died[0]
        assert not service.ready
        await service.stop()

    asyncio.run(main())


def test_plan_batches_sorts_by_length_and_respects_both_budgets() -> None:
    lengths = [5, 30, 10, 12, 31, 100, 6]
    plan = plan_batches(lengths, batch_size=3, max_tokens=64)
    assert sorted(r for rows in plan for r in rows) == list(range(7))
    for rows in plan:
        assert len(rows) <= 3 and (len(rows) == 1 or len(rows) * max(lengths[r] for r in rows) <= 64)
    assert plan == [[0, 6, 2], [3, 1], [4], [5]]  # greedy in length order; 100 > 64 still runs, alone
    assert plan_batches(lengths, batch_size=64) == [[0, 6, 2, 3, 1, 4, 5]]


def test_concurrent_requests_share_batches_cut_by_count_and_tokens(tmp_path: Path) -> None:
    config = make_config(tmp_path, batching=BatchingConfig(max_batch_size=4, max_wait_ms=1))
    items = tiny_items(10)

    async def main() -> None:
        service = await RewardService.create(config)
        seen: list[int] = []
        run_batch = service.batcher.run_batch
        service.batcher.run_batch = lambda tokens: (seen.append(len(tokens)), run_batch(tokens))[1]
        gate = threading.Event()
        blocker = asyncio.ensure_future(service.batcher.run_exclusive(lambda: service.runner.run(gate.wait, 10)))
        answers = [asyncio.ensure_future(service.score([item])) for item in items]
        await asyncio.sleep(0.05)
        gate.set()
        await blocker
        results = await asyncio.gather(*answers)
        assert seen == [4, 4, 2]  # ten one-item requests, cut by max_batch_size
        alone = [(await service.score([item])).logits[0] for item in items]
        assert max(abs(r.logits[0] - a) for r, a in zip(results, alone, strict=True)) <= 1e-5

        # The model thread cuts a batch further by padded tokens, shortest inputs together.
        passes: list[list[int]] = []
        rm = service.core.rm
        forward = rm.forward
        rm.forward = lambda rows: (passes.append([len(r) for r in rows]), forward(rows))[1]
        longest = max(len(ids) for ids in rm.encode(items))
        service.config.batching.max_tokens = 2 * longest
        service.config.batching.max_batch_size = 64
        scored = await service.score(items)
        assert all(len(p) * max(p) <= 2 * longest for p in passes) and sum(map(len, passes)) == 10
        assert [max(p) for p in passes] == sorted(max(p) for p in passes)
        assert max(abs(x - a) for x, a in zip(scored.logits, alone, strict=True)) <= 1e-5
        await service.stop()

    asyncio.run(main())


@pytest.mark.parametrize(("inflight", "copies"), [(1, 1), (2, 1), (3, 1), (2, 2)])
def test_the_batcher_hands_the_model_at_most_max_inflight_batches_per_copy(inflight: int, copies: int) -> None:
    from cooper.services.reward.batcher import Batcher

    async def main() -> None:
        handed: list[asyncio.Future[tuple[list[float], int]]] = []

        def run_batch(items: list[int]) -> asyncio.Future[tuple[list[float], int]]:
            handed.append(asyncio.get_running_loop().create_future())  # the model answers when the test says
            handed[-1].items = items  # type: ignore[attr-defined]
            return handed[-1]

        batcher = Batcher(run_batch, BatchingConfig(max_batch_size=1, max_wait_ms=0, max_inflight=inflight),
                          model_copies=copies)
        batcher.start()
        slots = inflight * copies
        requests = [asyncio.ensure_future(batcher.submit([n])) for n in range(6)]
        await asyncio.sleep(0.05)
        assert len(handed) == slots  # the rest wait in the queue, to be cut into batches as late as possible
        for answered in range(6):
            handed[answered].set_result(([float(handed[answered].items[0])], 0))  # type: ignore[attr-defined]
            await asyncio.sleep(0.01)
            assert len(handed) == min(6, slots + answered + 1)  # each answer frees one slot
        assert [await r for r in requests] == [([float(n)], 0) for n in range(6)]
        await batcher.stop()

    asyncio.run(main())


@pytest.mark.parametrize(("spread", "count"), [(False, 12), (True, 12), (True, 10)])
def test_spreading_cuts_batches_over_the_slots_instead_of_waiting_to_fill_one(spread: bool, count: int) -> None:
    """One-item requests at once, 2 copies x 2 slots, max batch 64 and a 200 ms wait: spreading hands the model 12
    as 4 batches of 3 at once (every copy busy, nobody waits); without it the 12 wait 200 ms for a batch of 64 that
    never fills and go as one. 10 spread are shares of ceil(10 / 4) = 3 (rounded down, five batches of 2 would need a
    fifth slot): three batches of 3 at once, and the 1 left over, less than a share (the outstanding items count those
    in flight), waits out the wait for company. A lone request with spreading goes at once."""
    from cooper.services.reward.batcher import Batcher

    async def main() -> None:
        handed: list[tuple[list[int], float]] = []

        async def run_batch(items: list[int]) -> tuple[list[float], int]:
            handed.append((items, time.monotonic()))
            await asyncio.sleep(0.01)
            return [float(x) for x in items], 0

        config = BatchingConfig(max_batch_size=64, max_wait_ms=200, max_inflight=2, spread=spread)
        batcher = Batcher(run_batch, config, model_copies=2)
        batcher.start()
        start = time.monotonic()
        results = await asyncio.gather(*(batcher.submit([n]) for n in range(count)))
        assert [logits for logits, _ in results] == [[float(n)] for n in range(count)]
        batches, at = [items for items, _ in handed], [moment - start for _, moment in handed]
        if not spread:
            assert batches == [list(range(12))] and at[0] >= 0.19
        elif count == 10:
            assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
            assert max(at[:3]) < 0.1 and at[3] >= 0.19
        else:
            assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]] and max(at) < 0.1
            handed.clear()
            start = time.monotonic()
            assert await batcher.submit([99]) == ([99.0], 0)
            assert handed[0][0] == [99] and handed[0][1] - start < 0.1
        await batcher.stop()

    asyncio.run(main())


def test_a_spread_batch_waits_the_wait_of_the_size_it_is_cut_to() -> None:
    """As above, 10 one-item requests spread over 4 slots, but with a wait per batch size (serving_defaults.
    spread_waits): the one left over waits for company as long as a batch of 3 (the share it is cut to) may, 30 ms,
    not the 200 ms of the largest batch."""
    from cooper.services.reward.batcher import Batcher

    async def main() -> None:
        handed: list[tuple[list[int], float]] = []

        async def run_batch(items: list[int]) -> tuple[list[float], int]:
            handed.append((items, time.monotonic()))
            await asyncio.sleep(0.3)
            return [float(x) for x in items], 0

        waits_ms = [0.0, 10.0, 20.0, 30.0] + [200.0] * 61
        batcher = Batcher(run_batch, BatchingConfig(max_batch_size=64, max_wait_ms=200, max_inflight=2, spread=True),
                          model_copies=2, waits_ms=waits_ms)
        batcher.start()
        start = time.monotonic()
        await asyncio.gather(*(batcher.submit([n]) for n in range(10)))
        assert [items for items, _ in handed] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
        assert 0.025 <= handed[3][1] - start < 0.15
        await batcher.stop()

    asyncio.run(main())


def test_a_request_whose_caller_went_away_part_way_stops_taking_the_model() -> None:
    """A caller cancelled after its first batch was handed to the model: the rest of its items are never batched,
    the request behind it is next, and the queue's count of waiting items is back to zero."""
    from cooper.services.reward.batcher import Batcher

    async def main() -> None:
        handed: list[list[int]] = []

        async def run_batch(items: list[int]) -> tuple[list[float], int]:
            handed.append(items)
            await asyncio.sleep(0.01)
            return [float(x) for x in items], 0

        batcher = Batcher(run_batch, BatchingConfig(max_batch_size=2, max_wait_ms=0, max_inflight=1))
        batcher.start()
        abandoned = asyncio.ensure_future(batcher.submit(list(range(100))))
        await asyncio.sleep(0)  # in the queue
        await asyncio.sleep(0.005)  # its first batch is with the model
        assert handed == [[0, 1]]
        abandoned.cancel()
        assert await batcher.submit([1000, 1001]) == ([1000.0, 1001.0], 0)
        assert handed == [[0, 1], [1000, 1001]]  # nothing more of the abandoned request
        assert batcher.queued_items == 0
        await batcher.stop()

    asyncio.run(main())

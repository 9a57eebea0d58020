"""The reward model in a child process of its own (reward.model_process=true, the default of `cooper serve`)."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.config import BatchingConfig
from cooper.runtime.durability import JOURNAL_DIR, UnjournaledUpdate
from cooper.runtime.ledger import idempotency_key
from cooper.services.reward.core import RewardCore
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.runner import CopiesRunner, ModelUnavailable, ProcessRunner
from cooper.services.reward.service import RewardService


def test_process_scores_equal_the_in_process_core_and_order_holds(tmp_path: Path) -> None:
    items = tiny_items(8)
    pairs = tiny_pairs(4)
    core = RewardCore.load(make_config(tmp_path / "local"))  # the same model, on this thread
    expected = core.score_tokens(core.rm.encode(items)).logits

    async def main() -> list[float]:
        service = await RewardService.create(make_config(tmp_path, model_process=True))
        assert isinstance(service.runner, ProcessRunner) and service.runner.process.pid != os.getpid()
        with pytest.raises(AttributeError, match="child process"):
            _ = service.core
        # Scores, updates and scores queued in this order run in this order, whatever the pipelining.
        answers = await asyncio.gather(
            service.score(items), service.update(idempotency_key("run", 0), pairs), service.score(items),
            service.update(idempotency_key("run", 1), pairs), service.score(items))
        assert [answers[0].version, answers[2].version, answers[4].version] == [0, 1, 2]
        assert max(abs(x - y) for x, y in zip(answers[0].logits, expected, strict=True)) <= 1e-6
        assert answers[2].logits != answers[0].logits  # the update reached the model in the child
        assert service.info().version == 2 and service.info().last_key == "run/1"
        await service.stop()
        assert not service.runner.process.is_alive()
        return answers[4].logits

    served_after_two_updates = asyncio.run(main())
    # The same two updates on the in-process core give the same model as the child's.
    core.apply_update("run/0", pairs)
    core.apply_update("run/1", pairs)
    after = core.score_tokens(core.rm.encode(items))
    assert after.version == 2
    assert max(abs(x - y) for x, y in zip(after.logits, served_after_two_updates, strict=True)) <= 1e-5


def test_tokenizing_in_the_model_processes_scores_as_the_serving_process_does(tmp_path: Path) -> None:
    """reward.tokenize_in_model: the texts cross to the model copies, which tokenize each batch; the logits and
    token counts are those of tokenizing in the serving process, a too-long item is cut the same way, and the
    serving process never loads a tokenizer."""
    long_item = ScoreItem("Q " * 10, "7", "step " * 400 + "so \\boxed{7}")  # over max_length: the long path
    items = [*tiny_items(7), long_item]
    core = RewardCore.load(make_config(tmp_path / "local", max_length=256))
    token_lists = core.rm.encode(items)
    assert len(token_lists[-1]) == 256
    expected = core.score_tokens(token_lists).logits

    async def main() -> None:
        service = await RewardService.create(make_config(
            tmp_path, model_process=True, model_copies=2, max_length=256, tokenize_in_model=True,
            batching=BatchingConfig(max_wait_ms=2, max_batch_size=4)))
        assert service.encoder is None
        one_by_one = await asyncio.gather(*(service.score([item]) for item in items))
        together = await service.score(items)
        assert [r.tokens for r in one_by_one] == [len(t) for t in token_lists]
        assert together.tokens == sum(len(t) for t in token_lists)
        for logits in ([r.logits[0] for r in one_by_one], together.logits):
            assert max(abs(x - y) for x, y in zip(logits, expected, strict=True)) <= 1e-5
        update = await service.update(idempotency_key("run", 0), tiny_pairs(4))
        assert (await service.score(items[:1])).version == update.version == 1
        await service.stop()

    asyncio.run(main())


def test_an_error_in_the_child_reaches_its_caller_and_the_child_keeps_serving(tmp_path: Path) -> None:
    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True))
        with pytest.raises(AttributeError, match="question"):
            await service.runner.submit("apply_update", None, ["not a pair"])
        with pytest.raises(AttributeError):
            await service.runner.submit("no_such_method")
        with pytest.raises(TypeError, match="cannot send apply_update to the model process"):
            await service.runner.submit("apply_update", None, [threading.Lock()])  # fails that call only
        # A call far larger than the socket's buffers, sent while a score is in flight: it waits in the transport's
        # buffer, the loop keeps running (the ticker), and the calls are answered in order.
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticking = asyncio.create_task(ticker())
        scored = service.runner.score_tokens(service.encoder.encode(tiny_items(2)))
        large = service.runner.submit("apply_update", None, ["x" * 20_000_000])
        with pytest.raises(AttributeError, match="question"):
            await large
        assert scored.done() and len(scored.result().logits) == 2  # sent first, answered first
        ticking.cancel()
        assert ticks > 10
        assert len((await service.score(tiny_items(3))).logits) == 3
        await service.stop()

    asyncio.run(main())


def test_a_dead_model_process_fails_requests_clearly_and_is_reported(tmp_path: Path) -> None:
    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True))
        assert service.ready and service.alive
        process = service.runner.process
        os.kill(process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while service.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not service.alive and not service.ready
        with pytest.raises(ModelUnavailable, match="exited"):
            await service.score(tiny_items(2))
        with pytest.raises(ModelUnavailable):
            await service.update(idempotency_key("run", 0), tiny_pairs(2))
        await asyncio.wait_for(service.stop(), 30)  # stopping a service whose model died does not hang

    asyncio.run(main())


def test_a_failed_journal_write_ends_the_model_process_and_a_restart_applies_the_update_once(tmp_path: Path) -> None:
    """The child does not go on serving from an update its journal lacks: it answers the error and exits, and the
    service is reported dead (on_exit; the gRPC server then stops, exit 1, for its supervisor to restart it)."""
    config = make_config(tmp_path, model_process=True)
    journal = Path(config.checkpoint_dir) / JOURNAL_DIR
    journal.parent.mkdir(parents=True)
    journal.write_text("")  # a file where the journal's directory goes: every append fails
    pairs = tiny_pairs(3)

    async def main() -> None:
        service = await RewardService.create(config)
        exited = asyncio.Event()
        service.runner.on_exit = exited.set
        with pytest.raises(UnjournaledUpdate, match="key 'run/0'"):
            await service.update(idempotency_key("run", 0), pairs)
        await asyncio.wait_for(exited.wait(), 30)
        assert not service.alive
        with pytest.raises(ModelUnavailable):
            await service.update(idempotency_key("run", 0), pairs)
        await asyncio.wait_for(service.stop(), 30)

    asyncio.run(main())
    journal.unlink()
    restarted = RewardCore.load(make_config(tmp_path))
    assert restarted.rm.version == 0 and restarted.durable.durability.saved_sequence is None  # nothing of it was saved on stop
    once = RewardCore.load(make_config(tmp_path / "once"))
    retry, expected = restarted.apply_update("run/0", pairs), once.apply_update("run/0", pairs)
    assert (retry.version, retry.replayed, retry.loss) == (1, False, expected.loss)


def test_a_model_that_does_not_load_fails_create_with_its_error(tmp_path: Path) -> None:
    config = make_config(tmp_path, model_process=True, model=str(tmp_path / "no-such-model"))

    async def main() -> None:
        await asyncio.wait_for(RewardService.create(config), 120)

    with pytest.raises(Exception, match="no-such-model"):
        asyncio.run(main())


def test_model_copies_share_the_scoring_and_stay_one_model_through_updates(tmp_path: Path) -> None:
    items = tiny_items(8)
    single = RewardCore.load(make_config(tmp_path / "single"))

    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True, model_copies=2,
                                                         batching=BatchingConfig(max_wait_ms=2, max_batch_size=4)))
        runner = service.runner
        assert isinstance(runner, CopiesRunner) and len({c.process.pid for c in runner.copies}) == 2
        batches, waiting, most_waiting = [0, 0], [0, 0], [0, 0]
        for index, copy in enumerate(runner.copies):  # count the batches each copy is handed, and how many at once
            copy.score_tokens = _counted(copy.score_tokens, batches, index, waiting, most_waiting)  # type: ignore[method-assign]
        scored = await asyncio.gather(*(service.score(items[k : k + 1]) for k in range(8) for _ in range(8)))
        # max_inflight (2) batches per copy: both copies work, each with its next batch waiting while one runs.
        assert all(batches) and most_waiting == [2, 2]
        expected = single.score_tokens(single.rm.encode(items)).logits
        assert max(abs(s.logits[0] - expected[k // 8]) for k, s in enumerate(scored)) <= 1e-5

        update = await service.update(idempotency_key("run", 0), tiny_pairs(4))
        assert update.version == 1
        tokens = single.rm.encode(items)
        after = [(await copy.score_tokens(tokens)) for copy in runner.copies]
        assert [a.version for a in after] == [1, 1] and after[0].logits == after[1].logits
        single.apply_update("run/0", tiny_pairs(4))
        assert max(abs(x - y) for x, y in zip(after[0].logits, single.score_tokens(tokens).logits, strict=True)) <= 1e-5

        saved = await service.save("copies")  # one checkpoint and one journal, written by the first copy
        root = tmp_path / "checkpoints"
        assert saved.version == 1 and sorted(p.name for p in root.iterdir()) == ["journal", Path(saved.path).name]
        assert not list((root / "journal").iterdir())  # the update was journaled once, and the save pruned it

        # One copy dies: the service stops serving (all copies go), like a single model process's death.
        os.kill(runner.copies[1].process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while service.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert not service.alive
        with pytest.raises(ModelUnavailable):
            await service.score(items[:1])
        await asyncio.wait_for(service.stop(), 30)
        assert not any(copy.process.is_alive() for copy in runner.copies)

    asyncio.run(main())


def _counted(score_tokens, counts: list[int], index: int, waiting: list[int], most: list[int]):  # type: ignore[no-untyped-def]
    def counting(tokens):  # type: ignore[no-untyped-def]
        counts[index] += 1
        waiting[index] += 1
        most[index] = max(most[index], waiting[index])
        future = score_tokens(tokens)
        future.add_done_callback(lambda _: waiting.__setitem__(index, waiting[index] - 1))
        return future

    return counting


def test_model_copies_that_differ_after_an_update_stop_the_service(tmp_path: Path) -> None:
    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True, model_copies=2))
        runner = service.runner
        assert isinstance(runner, CopiesRunner)
        second = runner.copies[1]
        call = second.call

        def drifting(operation, *args):  # type: ignore[no-untyped-def]
            future = call(operation, *args)
            if operation is not RewardCore.apply_update:
                return future
            return asyncio.ensure_future(_with_loss(future, 123.0))

        second.call = drifting  # type: ignore[method-assign]
        with pytest.raises(ModelUnavailable, match="differ"):
            await service.update(idempotency_key("run", 0), tiny_pairs(4))
        assert not service.alive
        await asyncio.wait_for(service.stop(), 30)
        assert not any(copy.process.is_alive() for copy in runner.copies)

    asyncio.run(main())


async def _with_loss(future, loss: float):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(await future, loss=loss)


def test_model_copies_need_model_processes(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="model_copies=2 needs reward.model_process=true"):
        make_config(tmp_path, model_process=False, model_copies=2)


def test_model_copies_run_one_linear_kernel_and_stay_one_model_through_updates(tmp_path: Path) -> None:
    # Copies compare their update results, which include scoring passes: all run the kernel the config or the first
    # copy chose. Forced to oneDNN here; "auto" times it in the first copy only, and says why.
    auto = RewardCore.load(make_config(tmp_path / "auto", cpu_linear="auto"))
    assert any(reason.startswith(f"cpu_linear={auto.rm.linear_kernel}: ") for reason in auto.batching_reasons)
    assert RewardCore.load(make_config(tmp_path / "other", cpu_linear="auto"), writes=False).rm.linear_kernel == "torch"

    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True, model_copies=2,
                                                         cpu_linear="onednn"))
        runner = service.runner
        assert isinstance(runner, CopiesRunner) and service.config.cpu_linear == "onednn"
        assert [await copy.call(RewardCore.linear_kernel) for copy in runner.copies] == ["onednn", "onednn"]
        update = await service.update(idempotency_key("run", 0), tiny_pairs(4))
        assert update.version == 1 and service.alive
        scored = await service.score(tiny_items(4))
        single = RewardCore.load(make_config(tmp_path / "single"))  # torch's kernel, the same update
        single.apply_update("run/0", tiny_pairs(4))
        expected = single.score_tokens(single.rm.encode(tiny_items(4))).logits
        assert max(abs(x - y) for x, y in zip(scored.logits, expected, strict=True)) <= 1e-5
        await asyncio.wait_for(service.stop(), 30)

    asyncio.run(main())

"""The reward model in a child process of its own (reward.model_process=true, the default of `cooper serve`)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.services.reward.core import RewardCore
from cooper.services.reward.runner import ModelUnavailable, ProcessRunner
from cooper.services.reward.service import RewardService, idempotency_key


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


def test_an_error_in_the_child_reaches_its_caller_and_the_child_keeps_serving(tmp_path: Path) -> None:
    async def main() -> None:
        service = await RewardService.create(make_config(tmp_path, model_process=True))
        with pytest.raises(AttributeError, match="question"):
            await service.runner.submit("apply_update", None, ["not a pair"])
        with pytest.raises(AttributeError):
            await service.runner.submit("no_such_method")
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


def test_a_model_that_does_not_load_fails_create_with_its_error(tmp_path: Path) -> None:
    config = make_config(tmp_path, model_process=True, model=str(tmp_path / "no-such-model"))

    async def main() -> None:
        await asyncio.wait_for(RewardService.create(config), 120)

    with pytest.raises(Exception, match="no-such-model"):
        asyncio.run(main())

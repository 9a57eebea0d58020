"""The serving settings the reward service chooses where the config leaves them unset (serving_defaults.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import pytest
from reward_testkit import make_config, tiny_items

from cooper.config import BatchingConfig, RewardConfig
from cooper.services.reward import serving_defaults
from cooper.services.reward.service import RewardService
from cooper.services.reward.serving_defaults import (
    choose_batch,
    choose_model_copies,
    choose_wait,
    spread_waits,
    time_forward_passes,
    with_batching,
    with_model_copies,
)


def test_the_batch_is_the_smallest_within_a_tenth_of_the_best_rate() -> None:
    # items/s: 1: 500, 2: 800, 4: 1400, 8: 1500, 16: 1100 -> 4 reaches 0.93 of the best (8)
    seconds = {1: 1 / 500, 2: 2 / 800, 4: 4 / 1400, 8: 8 / 1500, 16: 16 / 1100}
    chosen = choose_batch(seconds)
    assert chosen.value == 4
    assert "8: 1500" in chosen.why  # the measurements are in the reason the service logs
    assert choose_batch({1: 1 / 500, 2: 2 / 1100, 4: 4 / 2000}).value == 4  # still rising: the largest timed


def test_the_wait_is_a_quarter_of_a_forward_pass() -> None:
    assert choose_wait(0.008).value == 2.0
    assert choose_wait(0.0001).value == 0.1  # never 0: a request alone still gives others a moment to join


def test_model_copies_follow_the_cores_on_a_cpu_and_stay_one_on_a_gpu() -> None:
    assert choose_model_copies(cores=2, torch_threads=1, gpu=False, model_process=True).value == 2
    assert choose_model_copies(cores=8, torch_threads=2, gpu=False, model_process=True).value == 4
    assert choose_model_copies(cores=8, torch_threads=None, gpu=False, model_process=True).value == 1
    assert choose_model_copies(cores=8, torch_threads=1, gpu=True, model_process=True).value == 1
    assert choose_model_copies(cores=8, torch_threads=1, gpu=False, model_process=False).value == 1


def test_a_set_value_is_kept_and_an_unset_one_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serving_defaults, "machine_cores", lambda: 2)
    chosen, why = with_model_copies(RewardConfig(torch_threads=1, device="cpu"))
    assert chosen.model_copies == 2 and why is not None and "2 physical core(s)" in why.why
    kept, why = with_model_copies(RewardConfig(torch_threads=1, device="cpu", model_copies=1))
    assert kept.model_copies == 1 and why is None

    def never(size: int) -> None:
        raise AssertionError("nothing is timed when both are set")

    config = RewardConfig(batching=BatchingConfig(max_batch_size=16, max_wait_ms=3))
    kept, reasons, waits = with_batching(config, never)
    assert reasons == [] and waits is None and kept.batching == config.batching.model_copy(update={"spread": False})
    # Spreading follows the choice of the batch where it is unset, and stays as set where it is set.
    assert with_batching(RewardConfig(batching=BatchingConfig(max_batch_size=16, max_wait_ms=3, spread=True)),
                         never)[0].batching.spread is True
    chosen, reasons, waits = with_batching(RewardConfig(batching=BatchingConfig(max_wait_ms=3)), lambda size: None)
    assert chosen.batching.spread is True and reasons[0].startswith("spread=True") and waits is None  # wait set
    assert with_batching(RewardConfig(batching=BatchingConfig(max_wait_ms=3, spread=False)),
                         lambda size: None)[0].batching.spread is False
    # The batch set, the wait unset: the wait comes from a pass of the set batch.
    sizes: list[int] = []
    waited, reasons, waits = with_batching(RewardConfig(batching=BatchingConfig(max_batch_size=16)), sizes.append)
    assert set(sizes) == {16} and waited.batching.max_batch_size == 16 and waited.batching.max_wait_ms is not None
    assert len(reasons) == 1 and reasons[0].startswith("max_wait_ms=") and waited.batching.spread is False
    assert waits is None  # not spread: every batch waits max_wait_ms


def test_calibration_stops_past_the_peak() -> None:
    # A model whose per-item time is flat up to 8 and doubles beyond it, as a CPU's cache runs out.
    def forward(size: int) -> None:
        time.sleep(0.0004 * size * (1 if size <= 8 else 2))

    seconds = time_forward_passes(forward)
    assert sorted(seconds) == [1, 2, 4, 8, 16, 32]  # 16 and 32 both below 0.9 of the best: stop


def test_the_choice_is_what_the_timings_imply(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass of n items takes 0.1 ms plus 0.4 ms an item up to 8 and 0.8 ms beyond: items/s 2000, 2222, 2353, 2424,
    then 1240 and 1245 (two below 0.9 of the best: the calibration stops at 32). The smallest batch within 0.9 of
    2424 (2182) is 2, and the wait a quarter of its pass (0.9 ms): 0.2 ms; a spread batch of one waits a quarter of
    its own pass (0.5 ms): 0.12 ms."""
    def pass_seconds(forward: object, size: int) -> float:
        return 0.0001 + 0.0004 * size * (1 if size <= 8 else 2)

    monkeypatch.setattr(serving_defaults, "time_pass", pass_seconds)
    chosen, reasons, waits = with_batching(RewardConfig(batching=BatchingConfig()), lambda size: None)
    assert (chosen.batching.max_batch_size, chosen.batching.max_wait_ms) == (2, 0.2)
    assert "32: 1245" in reasons[1] and reasons[2].startswith("max_wait_ms=0.2")
    assert waits == pytest.approx([0.0, 0.125, 0.225], abs=0.006) and "ms for one item" in reasons[3]


def test_a_spread_batch_waits_a_share_of_its_own_pass_interpolated_between_the_sizes_timed() -> None:
    # Passes of 1 ms at 1, 2 ms at 4, 10 ms at 16 (as a calibration times 1, 2, 4, ...; 2 and 8 left out here).
    waits = spread_waits({1: 0.001, 4: 0.002, 16: 0.010}, 16)
    assert len(waits) == 17 and waits[1] == 0.25 and waits[4] == 0.5 and waits[16] == 2.5
    assert waits[2] == round(0.25 * (1 + 1 / 3), 2) and waits[10] == round(0.25 * 6, 2)  # on the line between
    assert waits == sorted(waits) and spread_waits({1: 1e-6}, 1)[1] == 0.1  # never under 0.1 ms


def test_a_service_left_unset_calibrates_and_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    config = make_config(tmp_path, batching=BatchingConfig(), model_copies=None, torch_threads=1)
    caplog.set_level(logging.INFO, logger="cooper.reward")
    timed: list[dict[int, float]] = []  # what the service's own calibration measured of the model

    def recorded(forward: object) -> dict[int, float]:
        timed.append(time_forward_passes(forward))  # type: ignore[arg-type]
        return timed[-1]

    monkeypatch.setattr(serving_defaults, "time_forward_passes", recorded)

    async def main() -> None:
        service = await RewardService.create(config)
        try:
            batching = service.config.batching
            [seconds] = timed
            assert batching.max_batch_size == choose_batch(seconds).value
            assert batching.max_wait_ms == choose_wait(seconds[batching.max_batch_size]).value
            # spread (chosen too), each batch waits a share of its own size's pass, from the same calibration
            assert service.batcher.waits_ms == spread_waits(seconds, batching.max_batch_size)
            assert service.batcher.config == batching and service.core.config.batching == batching
            items = tiny_items(3 * batching.max_batch_size)
            scored = await service.score(items)  # more items than one pass: cut by the chosen size
            assert len(scored.logits) == len(items)
        finally:
            await service.stop()

    asyncio.run(main())
    logged = " ".join(r.getMessage() for r in caplog.records if "chosen at start-up" in r.getMessage())
    assert "max_batch_size=" in logged and "calibration, items/s by batch" in logged and "max_wait_ms=" in logged
    assert "spread=True" in logged
    assert "model_copies=1: reward.model_process is off" in logged

"""MetricsLog's TensorBoard events, written without tensorboard's writer: TensorBoard reads them back."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cooper.orchestrator.outputs import MetricsLog, _masked_crc32c


def test_the_record_checksum_is_tensorboards():
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    for size in (0, 1, 8, 255, 4096):
        data = os.urandom(size)
        assert _masked_crc32c(data) == masked_crc32c(data)


def test_tensorboard_reads_every_number_of_every_step_across_a_resume(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path)
    log.write({"step": 0, "reward_mean": 0.5, "policy/kl": 0.01, "mode": "rule", "skipped": True})
    log.write({"step": 1, "reward_mean": 0.75, "policy/kl": 0.02})
    log.close()
    resumed = MetricsLog(tmp_path)  # a resumed run: a second event file beside the first
    resumed.write({"step": 2, "reward_mean": 1.0, "policy/kl": 0.03})
    resumed.close()

    assert len(list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))) == 2
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["policy/kl", "reward_mean"]  # no strings, no booleans, no step
    assert [(e.step, e.value) for e in events.Scalars("reward_mean")] == [(0, 0.5), (1, 0.75), (2, 1.0)]
    assert [e.step for e in events.Scalars("policy/kl")] == [0, 1, 2]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]

"""The update journal (cooper/runtime/journal.py) and the rollout it stores (trainer.rollout_tensors): entries
continue one history only, pruning follows checkpoints, and a rollout comes back as the update reads it."""

from __future__ import annotations

from pathlib import Path

import pytest

from cooper.runtime.journal import UpdateJournal
from cooper.services.policy.trainer import RolloutSample, rollout_samples, rollout_tensors


def test_the_chain_follows_one_history_and_stops_at_a_gap(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path / "journal")
    assert journal.chain(0, "") == [] and journal.versions() == []
    for version, after, key in ((1, "", "r/0"), (2, "r/0", "r/1"), (3, "r/1", "r/2"), (5, "r/3", "r/4")):
        journal.append(version, after, {"key": key})
    assert [e["key"] for e in journal.chain(0, "")] == ["r/0", "r/1", "r/2"]  # 4 is missing: 5 cannot follow
    assert [e["key"] for e in journal.chain(1, "r/0")] == ["r/1", "r/2"]
    assert journal.chain(1, "other/0") == []  # a checkpoint of another history: its entries are not this one's
    journal.append(2, "other/0", {"key": "other/1"})  # that history goes on: its entry replaces the old one
    assert [e["key"] for e in journal.chain(1, "other/0")] == ["other/1"]
    assert [e["key"] for e in journal.chain(0, "")] == ["r/0"]  # entry 2 is now the other history's
    journal.prune(2)
    assert journal.versions() == [3, 5]
    with pytest.raises(ValueError, match="needs the key"):
        journal.append(6, "r/4", {})


def test_a_cut_short_append_is_discarded_at_start(tmp_path: Path) -> None:
    journal = UpdateJournal(tmp_path)
    journal.append(1, "", {"key": "r/0"})
    (tmp_path / ".tmp-abc.pt").write_bytes(b"partial")
    journal.discard_partial()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u00000001.pt"]


def test_a_rollout_comes_back_as_the_update_reads_it(tmp_path: Path) -> None:
    samples = [RolloutSample([5, 6, 7], [8, 9], [-0.25, -1.5]), RolloutSample([5, 6, 7], [], None),
               RolloutSample([1], [2, 3, 4], [-0.5])]  # no log-probs, and log-probs of the wrong length (ignored)
    journal = UpdateJournal(tmp_path)
    journal.append(1, "", {"key": "r/0", "rollout": rollout_tensors(samples)})
    (entry,) = journal.chain(0, "")
    assert rollout_samples(entry["rollout"]) == samples

"""The bookkeeping both trainers share (cooper/runtime/durable_trainer.py): the sequence, the typed ledger, journal
replay, checkpoint state and the branches a restore abandons. The model here is a stand-in that writes one file: what
is under test is the bookkeeping around it (the trainers' own tests save and load real models)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from cooper.runtime.checkpoint import POLICY, read_state
from cooper.runtime.durability import Durability
from cooper.runtime.durable_trainer import DurableTrainer
from cooper.services.policy.core import decode_record, encode_record
from cooper.services.policy.messages import RestoreResult, TrainResult


class Saves:
    """Writes one file where a model's or a tokenizer's files would go."""

    def save_pretrained(self, path: Path, **_: Any) -> None:
        (Path(path) / "weights.txt").write_text("w")


def trainer(root: Path, save_every: int = 0) -> DurableTrainer[TrainResult | RestoreResult]:
    durability = Durability(root, POLICY, save_every=save_every, keep_checkpoints=10, journal=True, service="test")
    return DurableTrainer(durability, 4, encode_record, decode_record)


def commit(book: DurableTrainer[TrainResult | RestoreResult], key: str, loss: float) -> None:
    book.commit(key, TrainResult({"loss": loss}, book.sequence + 1, False), {"key": key, "loss": loss})


def save(book: DurableTrainer[TrainResult | RestoreResult], tag: str = "") -> str:
    return book.save(Saves(), Saves(), dict, book.state(tag, version=book.sequence))


def test_a_restart_replays_the_journal_after_the_newest_checkpoint_in_order(tmp_path: Path) -> None:
    first = trainer(tmp_path)
    commit(first, "run/0", 0.5)
    save(first)
    for step, loss in [(1, 0.25), (2, 0.125)]:
        commit(first, f"run/{step}", loss)
    again = trainer(tmp_path)
    checkpoint = again.start()
    assert checkpoint is not None and checkpoint.name == "v00000001"
    again.resume(checkpoint, read_state(checkpoint))
    applied: list[float] = []

    def apply(entry: dict[str, Any]) -> TrainResult:
        applied.append(entry["loss"])
        return TrainResult({"loss": entry["loss"]}, again.sequence + 1, False)

    assert again.replay(apply) == 2 and applied == [0.25, 0.125]
    assert (again.sequence, again.last_key) == (3, "run/2")
    assert again.recorded("run/0") == TrainResult({"loss": 0.5}, 1, False)  # from the checkpoint
    assert again.recorded("run/2") == TrainResult({"loss": 0.125}, 3, False)  # from the journal
    assert again.save_if_unsaved(lambda: "saved") == "saved"


def test_a_checkpoint_keeps_typed_records_and_a_rollback_skips_an_abandoned_branch(tmp_path: Path) -> None:
    book = trainer(tmp_path)
    for step in range(4):
        commit(book, f"run/{step}", float(step))
        save(book)
    target, sequence = book.rollback_target(2)
    assert target is not None and (target.name, sequence) == ("v00000002", 2)
    book.abandon_after(sequence)  # versions 3 and 4 belong to the branch left behind
    book.commit_saved("run/restore", RestoreResult(2, book.sequence + 1, "v5", False))
    save(book, "restored")
    resumed = trainer(tmp_path)
    latest = resumed.start()
    assert latest is not None
    resumed.resume(latest, read_state(latest))
    assert resumed.abandoned == [(3, 4)] and resumed.sequence == 5
    assert resumed.recorded("run/restore") == RestoreResult(2, 5, "v5", False)
    assert isinstance(resumed.recorded("run/1"), TrainResult)
    assert resumed.rollback_target(4)[1] == 2  # v3 and v4 are another branch's weights
    assert resumed.save_if_unsaved(lambda: "saved") is None  # nothing since the newest checkpoint


def test_a_policy_checkpoint_from_before_the_typed_records_resumes(tmp_path: Path) -> None:
    book = trainer(tmp_path)
    old = {"version": 7, "last_key": "run/6", "tag": "", "model": "m", "abandoned": [[2, 3]], "history": {
        "run/5": {"metrics": {"loss": 0.5}, "version": 6},
        "run/6": {"metrics": {"restored_version": 1.0}, "version": 7, "checkpoint": "ckpt/v7"}}}
    book.resume(tmp_path / "v00000007", old)
    assert (book.sequence, book.last_key, book.abandoned) == (7, "run/6", [(2, 3)])
    assert book.recorded("run/5") == TrainResult({"loss": 0.5}, 6, False)
    assert book.recorded("run/6") == RestoreResult(1, 7, "ckpt/v7", False)
    assert book.state("")["results"]["run/6"] == {key: value for key, value in
                                                  asdict(RestoreResult(1, 7, "ckpt/v7", False)).items()
                                                  if key != "replayed"}

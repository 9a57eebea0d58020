"""VerifyRM's update journal and background checkpoints: a restart comes back at the update it last answered, with
weights, AdamW state, replay buffer and recorded results bit-identical to the uninterrupted core's (real tiny model,
the same cooper/runtime/durability.py as the policy)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_holds import HeldWrites
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.runtime.checkpoint import REWARD, complete_checkpoints, read_state
from cooper.runtime.durability import JOURNAL_DIR, UnjournaledUpdate
from cooper.runtime.journal import UpdateJournal
from cooper.services.reward.core import RewardCore


def journal_config(root: Path, **overrides):  # type: ignore[no-untyped-def]
    """Every path the update takes: replay sampling seeded by the version, AdamW restarts, several optimizer steps."""
    return make_config(root, save_every=3, keep_checkpoints=2, replay_updates=3, replay_sample=2,
                       optimizer_restart_every=4, update_steps=2, **overrides)


def state_of(core: RewardCore) -> tuple[dict[str, torch.Tensor], dict, list, tuple]:
    core.durable.wait()
    optimizer = core.rm.optimizer_state()
    return ({k: v.clone() for k, v in core.rm.model.state_dict().items()}, optimizer, list(core._replay),
            (core.rm.version, core.updates, core.last_key, core.durable.ledger.results()))


def assert_same(a: tuple, b: tuple) -> None:
    weights_a, optimizer_a, replay_a, book_a = a
    weights_b, optimizer_b, replay_b, book_b = b
    assert weights_a.keys() == weights_b.keys()
    for name in weights_a:
        assert torch.equal(weights_a[name], weights_b[name]), name
    moments_a, moments_b = optimizer_a["optimizer"]["state"], optimizer_b["optimizer"]["state"]
    assert moments_a.keys() == moments_b.keys()
    for index in moments_a:
        for name, value in moments_a[index].items():
            assert torch.equal(value, moments_b[index][name]), (index, name)
    assert optimizer_a["scheduler"] == optimizer_b["scheduler"]
    assert replay_a == replay_b
    assert book_a == book_b


def apply(core: RewardCore, steps: range) -> None:
    for step in steps:
        # Unkeyed updates in the middle: the journal follows them by the key before.
        key = None if step % 5 == 2 else f"run/{step}"
        core.apply_update(key, tiny_pairs(3, seed=step))


@pytest.mark.parametrize("crash_after", [4, 7])
def test_a_restart_applies_the_journal_and_comes_back_bit_identical(tmp_path: Path, crash_after: int) -> None:
    steps = 10
    calm = RewardCore.load(journal_config(tmp_path / "calm"))
    apply(calm, range(steps))

    config = journal_config(tmp_path / "crash")
    first = RewardCore.load(config)
    apply(first, range(crash_after))
    first.durable.wait()  # what a crash leaves: the newest checkpoint on disk, the journal after it
    saved = read_state(complete_checkpoints(config.checkpoint_dir, REWARD)[-1], REWARD)["updates"]
    journal = UpdateJournal(Path(config.checkpoint_dir) / JOURNAL_DIR)
    assert journal.versions() == list(range(saved + 1, crash_after + 1)) and journal.versions()
    del first  # dropped with no save: a SIGKILL

    second = RewardCore.load(config)
    assert (second.rm.version, second.updates) == (crash_after, crash_after)
    apply(second, range(crash_after, steps))
    assert_same(state_of(second), state_of(calm))
    items = tiny_items(6)
    assert second.score_tokens(second.rm.encode(items)).logits == calm.score_tokens(calm.rm.encode(items)).logits


def test_a_background_save_writes_the_state_it_was_started_from(
        tmp_path: Path, hold_checkpoint_writes: Callable[[Path], HeldWrites]) -> None:
    """The write of checkpoint 3 is held until updates 4 and 5 have changed the weights and AdamW moments in place.
    It must still write update 3's state (snapshot_state's copy): the restart applies the journal of 4 and 5 on top
    of it, so a checkpoint that had taken them in would come back with them applied twice."""
    calm = RewardCore.load(journal_config(tmp_path / "calm"))  # its writes are not held
    apply(calm, range(5))
    expected = state_of(calm)

    config = journal_config(tmp_path / "crash")
    held = hold_checkpoint_writes(Path(config.checkpoint_dir))
    first = RewardCore.load(config)
    apply(first, range(3))  # save_every 3: update 3 starts the background write
    assert held.started.wait(60)
    apply(first, range(3, 5))  # while the writer waits
    held.release.set()
    first.durable.wait()
    assert [path.name for path in complete_checkpoints(config.checkpoint_dir, REWARD)] == ["v00000003-u00000003"]
    assert UpdateJournal(Path(config.checkpoint_dir) / JOURNAL_DIR).versions() == [4, 5]
    del first  # dropped with no save: a SIGKILL

    second = RewardCore.load(config)
    assert (second.rm.version, second.updates) == (5, 5)
    assert_same(state_of(second), expected)


def test_a_save_cut_short_is_skipped_at_start_and_its_name_written_again(tmp_path: Path) -> None:
    config = journal_config(tmp_path / "crash")
    root = Path(config.checkpoint_dir)
    first = RewardCore.load(config)
    apply(first, range(5))
    first.durable.wait()
    # What a SIGKILL leaves: checkpoint 3, the journal of updates 4 and 5, and saves cut short: one in its temp
    # directory, one under its final name without the state file that completes it (written last).
    assert [path.name for path in complete_checkpoints(root, REWARD)] == ["v00000003-u00000003"]
    shutil.copytree(root / "v00000003-u00000003", root / ".tmp-cut-short")
    shutil.copytree(root / "v00000003-u00000003", root / "v00000006-u00000006")
    (root / "v00000006-u00000006" / REWARD.state_file).unlink()
    del first

    resumed = RewardCore.load(config)
    assert not (root / ".tmp-cut-short").exists()  # deleted at start
    assert (resumed.rm.version, resumed.updates, resumed.last_key) == (5, 5, "run/4")
    calm = RewardCore.load(journal_config(tmp_path / "calm"))
    apply(calm, range(6))
    apply(resumed, range(5, 6))  # update 6 is saved under the name the cut-short save left
    assert_same(state_of(resumed), state_of(calm))
    assert read_state(root / "v00000006-u00000006", REWARD)["updates"] == 6
    assert_same(state_of(RewardCore.load(config)), state_of(calm))  # that checkpoint is whole: it loads as update 6


def fail_the_next_journal_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next UpdateJournal.append raises as a full disk does; the ones after it write."""
    unfailing_append = UpdateJournal.append

    def append_failing_once(journal: UpdateJournal, *args: Any) -> None:
        monkeypatch.setattr(UpdateJournal, "append", unfailing_append)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(UpdateJournal, "append", append_failing_once)


def test_a_failed_journal_write_refuses_the_retry_until_a_restart_applies_it_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    once = RewardCore.load(journal_config(tmp_path / "once"))
    apply(once, range(2))

    config = journal_config(tmp_path / "failing")
    core = RewardCore.load(config)
    apply(core, range(1))
    fail_the_next_journal_write(monkeypatch)
    with pytest.raises(UnjournaledUpdate, match="update 2 .key 'run/1'.") as failed:
        core.apply_update("run/1", tiny_pairs(3, seed=1))
    assert isinstance(failed.value.__cause__, OSError)
    # The update is in memory but not in the journal, nor its key in the ledger: the retry would apply it again.
    with pytest.raises(UnjournaledUpdate):
        core.apply_update("run/1", tiny_pairs(3, seed=1))
    with pytest.raises(UnjournaledUpdate):  # scores of weights that a restart would not come back to
        core.score_tokens(core.rm.encode(tiny_items(2)))
    with pytest.raises(UnjournaledUpdate):  # a checkpoint would hold the update without its key
        core.save("manual")
    assert core.save_if_unsaved("stop") is None
    assert complete_checkpoints(config.checkpoint_dir, REWARD) == []
    del core

    restarted = RewardCore.load(config)
    assert (restarted.rm.version, restarted.updates, restarted.last_key) == (1, 1, "run/0")
    retry = restarted.apply_update("run/1", tiny_pairs(3, seed=1))
    assert (retry.version, retry.replayed) == (2, False)
    assert_same(state_of(restarted), state_of(once))  # applied exactly once, bit for bit


def test_a_retry_after_a_restart_is_answered_from_the_journal(tmp_path: Path) -> None:
    config = journal_config(tmp_path)
    first = RewardCore.load(config)
    apply(first, range(4))
    answered = first.apply_update("run/4", tiny_pairs(3, seed=4))
    first.durable.wait()
    del first

    second = RewardCore.load(config)
    weights = {k: v.clone() for k, v in second.rm.model.state_dict().items()}
    retry = second.apply_update("run/4", tiny_pairs(3, seed=4))
    assert retry.replayed and (retry.loss, retry.grad_norm, retry.version) == (
        answered.loss, answered.grad_norm, answered.version)
    assert all(torch.equal(v, second.rm.model.state_dict()[k]) for k, v in weights.items())  # nothing trained
    assert second.info().last_key == "run/4"


def test_checkpoints_prune_the_journal_and_keep_only_the_newest(tmp_path: Path) -> None:
    config = journal_config(tmp_path)
    core = RewardCore.load(config)
    apply(core, range(10))
    core.durable.wait()
    names = [path.name for path in complete_checkpoints(config.checkpoint_dir, REWARD)]
    assert names == ["v00000006-u00000006", "v00000009-u00000009"]  # every 3 updates, keep 2
    assert UpdateJournal(Path(config.checkpoint_dir) / JOURNAL_DIR).versions() == [10]
    assert core.info().checkpoint.endswith("v00000009-u00000009")
    assert core.save_if_unsaved("stop") is not None and core.save_if_unsaved("stop") is None
    assert UpdateJournal(Path(config.checkpoint_dir) / JOURNAL_DIR).versions() == []


def test_a_copy_that_does_not_write_reads_the_journal_and_leaves_it(tmp_path: Path) -> None:
    config = journal_config(tmp_path)
    writer = RewardCore.load(config)
    apply(writer, range(4))
    writer.durable.wait()
    journal = UpdateJournal(Path(config.checkpoint_dir) / JOURNAL_DIR)
    assert journal.versions() == [4]
    reader = RewardCore.load(config, writes=False)  # a second model copy (reward.model_copies)
    assert (reader.rm.version, reader.updates) == (4, 4)
    writer.apply_update("run/4", tiny_pairs(3, seed=4))
    reader.apply_update("run/4", tiny_pairs(3, seed=4))
    assert_same(state_of(reader), state_of(writer))
    # The reader wrote nothing: the journal is the writer's (its entry 5) and no checkpoint came from the reader.
    assert journal.versions() == [4, 5]
    assert reader.durable.latest == str(complete_checkpoints(config.checkpoint_dir, REWARD)[-1])


def test_the_journal_needs_periodic_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="reward.journal with reward.save_every 0"):
        make_config(tmp_path, save_every=0)
    assert make_config(tmp_path, save_every=0, journal=False).save_every == 0

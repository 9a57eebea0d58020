"""Checkpoints every few updates, written in the background, and the update journal between them: a policy service
that stops without a final save comes back at the version it last answered, bit for bit the state of one that never
stopped, and answers a retried Train from the recorded result."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from checkpoint_holds import HeldWrites

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import complete_checkpoints, read_optimizer_state
from cooper.runtime.durability import JOURNAL_DIR, UnjournaledUpdate
from cooper.runtime.journal import UpdateJournal
from cooper.services.policy.core import PolicyCore
from cooper.services.policy.engine import SamplingParams
from cooper.services.policy.trainer import RolloutSample

PROMPTS = ["What is 2+3?", "Add 4 and 5.", "Compute 7 minus 2.", "What is 6 times 1?"]
UPDATES = 7


def _rollout(core: PolicyCore, step: int) -> tuple[list[RolloutSample], list[float]]:
    groups, _ = core.generate(PROMPTS[:2], SamplingParams(n=4, max_new_tokens=6, seed=step))
    # With the engine's log-probs: they are part of the update (mismatch metrics), so the journal must keep them.
    samples = [RolloutSample(c.prompt_token_ids, c.token_ids, c.logprobs) for g in groups for c in g]
    return samples, [float((step + i) % 3 == 0) for i in range(len(samples))]


def _train(core: PolicyCore, steps: range) -> dict[str, Any]:
    return {f"j/{t}": core.train(f"j/{t}", *_rollout(core, t), group_size=4) for t in steps}


def _optimizer_tensors(core: PolicyCore) -> list[torch.Tensor]:
    return [t for state in core.trainer.optimizer.state_dict()["state"].values() for t in state.values()]


def _config(make_config: Callable[..., PolicyConfig], path: Path) -> PolicyConfig:
    # The KL to the frozen initial policy is in the loss, so the replay also needs the right reference.
    return make_config(path, save_every=3, keep_checkpoints=2, optim={"lr": 1e-2, "warmup_steps": 4},
                       grpo={"kl_coef": 0.01})


def test_a_policy_stopped_without_saving_resumes_bit_identical(tmp_path: Path,
                                                                make_config: Callable[..., PolicyConfig]) -> None:
    uninterrupted = PolicyCore(_config(make_config, tmp_path / "a"))
    expected = _train(uninterrupted, range(UPDATES))

    config = _config(make_config, tmp_path / "b")
    stopped = PolicyCore(config)
    _train(stopped, range(5))
    stopped.wait_for_saves()
    # What a SIGKILL leaves: checkpoint v3, the journal of updates 4 and 5, and a save cut short.
    assert [p.name for p in complete_checkpoints(tmp_path / "b")] == ["v00000003"]
    assert UpdateJournal(tmp_path / "b" / JOURNAL_DIR).versions() == [4, 5]
    shutil.copytree(tmp_path / "b" / "v00000003", tmp_path / "b" / ".tmp-cut-short")
    del stopped

    resumed = PolicyCore(config)
    assert not (tmp_path / "b" / ".tmp-cut-short").exists()  # a partial save is deleted at start
    assert (resumed.version, resumed.last_key) == (5, "j/4")
    again = resumed.train("j/4", *_rollout(resumed, 4), group_size=4)  # a retry of an update answered before the stop
    assert again.replayed and again.version == 5 and again.metrics == expected["j/4"].metrics
    assert _train(resumed, range(5, UPDATES)) == {k: v for k, v in expected.items() if k in ("j/5", "j/6")}
    resumed.wait_for_saves()
    uninterrupted.wait_for_saves()

    for (name, p), q in zip(uninterrupted.model.named_parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(p, q), name  # bit for bit, not close
    assert all(torch.equal(a, b) for a, b in zip(_optimizer_tensors(uninterrupted), _optimizer_tensors(resumed),
                                                 strict=True))
    assert resumed.trainer.updates == uninterrupted.trainer.updates == UPDATES  # the warm-up goes on where it was
    # The background checkpoint of v6 holds the same state as the live model, and the journal only update 7.
    assert [p.name for p in complete_checkpoints(tmp_path / "b")] == ["v00000003", "v00000006"]
    assert UpdateJournal(tmp_path / "b" / JOURNAL_DIR).versions() == [7]
    saved = read_optimizer_state(tmp_path / "b" / "v00000006")
    assert saved["updates"] == 6


def _assert_same_state(expected: PolicyCore, actual: PolicyCore) -> None:
    for (name, p), q in zip(expected.model.named_parameters(), actual.model.parameters(), strict=True):
        assert torch.equal(p, q), name  # bit for bit, not close
    assert all(torch.equal(a, b) for a, b in zip(_optimizer_tensors(expected), _optimizer_tensors(actual), strict=True))
    assert (actual.version, actual.trainer.updates) == (expected.version, expected.trainer.updates)


def test_a_background_save_writes_the_state_it_was_started_from(
        tmp_path: Path, make_config: Callable[..., PolicyConfig],
        hold_checkpoint_writes: Callable[[Path], HeldWrites]) -> None:
    """The write of checkpoint v3 is held until updates 4 and 5 have changed the weights and AdamW moments in place.
    It must still write v3 (snapshot_state's copy): the restart applies the journal of 4 and 5 on top of it."""
    uninterrupted = PolicyCore(_config(make_config, tmp_path / "a"))  # its writes, into a/, are not held
    _train(uninterrupted, range(5))
    uninterrupted.wait_for_saves()
    assert [p.name for p in complete_checkpoints(tmp_path / "a")] == ["v00000003"]

    held = hold_checkpoint_writes(tmp_path / "b")
    config = _config(make_config, tmp_path / "b")
    stopped = PolicyCore(config)
    _train(stopped, range(3))  # save_every 3: v3 starts the background write
    assert held.started.wait(60)
    _train(stopped, range(3, 5))  # while the writer waits
    held.release.set()
    stopped.wait_for_saves()
    assert [p.name for p in complete_checkpoints(tmp_path / "b")] == ["v00000003"]
    assert UpdateJournal(tmp_path / "b" / JOURNAL_DIR).versions() == [4, 5]
    del stopped  # no save on stop: a SIGKILL

    _assert_same_state(uninterrupted, PolicyCore(config))


def test_a_failed_journal_write_refuses_the_retry_until_a_restart_applies_it_once(
        tmp_path: Path, make_config: Callable[..., PolicyConfig], monkeypatch: pytest.MonkeyPatch) -> None:
    once = PolicyCore(_config(make_config, tmp_path / "a"))
    rollouts = []
    for step in range(2):
        rollouts.append(_rollout(once, step))
        once.train(f"j/{step}", *rollouts[step], group_size=4)

    config = _config(make_config, tmp_path / "b")
    core = PolicyCore(config)
    core.train("j/0", *rollouts[0], group_size=4)
    unfailing_append = UpdateJournal.append

    def append_failing_once(journal: UpdateJournal, *args: Any) -> None:
        monkeypatch.setattr(UpdateJournal, "append", unfailing_append)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(UpdateJournal, "append", append_failing_once)
    with pytest.raises(UnjournaledUpdate, match="update 2 .key 'j/1'.") as failed:
        core.train("j/1", *rollouts[1], group_size=4)
    assert isinstance(failed.value.__cause__, OSError)
    # The update is in memory but not in the journal, nor its key in the ledger: the retry would apply it again.
    with pytest.raises(UnjournaledUpdate):
        core.train("j/1", *rollouts[1], group_size=4)
    with pytest.raises(UnjournaledUpdate):  # samples of weights that a restart would not come back to
        core.generate(PROMPTS[:1], SamplingParams(n=2, max_new_tokens=2))
    with pytest.raises(UnjournaledUpdate):  # a checkpoint would hold the update without its key
        core.save("manual")
    assert core.save_if_unsaved("stop") is None
    assert complete_checkpoints(tmp_path / "b") == []
    core.close()
    del core

    restarted = PolicyCore(config)
    assert (restarted.version, restarted.last_key) == (1, "j/0")
    retry = restarted.train("j/1", *rollouts[1], group_size=4)
    assert (retry.version, retry.replayed) == (2, False)
    _assert_same_state(once, restarted)  # applied exactly once


def test_a_journal_behind_a_lost_checkpoint_is_not_applied(tmp_path: Path,
                                                           make_config: Callable[..., PolicyConfig]) -> None:
    """The newest checkpoint deleted (a volume restored from an older copy): the journal continues it, not the one
    before, so the service comes back at the older checkpoint's version, which the orchestrator then refuses
    (InconsistentRun), rather than apply updates to the wrong weights."""
    config = make_config(tmp_path, save_every=2, grpo={"kl_coef": 0.0, "track_kl": False})
    core = PolicyCore(config)
    _train(core, range(5))
    core.wait_for_saves()
    del core
    shutil.rmtree(tmp_path / "v00000004")
    resumed = PolicyCore(config)
    assert (resumed.version, resumed.last_key) == (2, "j/1")


def test_without_a_journal_a_restart_goes_back_to_the_checkpoint(tmp_path: Path,
                                                                 make_config: Callable[..., PolicyConfig]) -> None:
    config = make_config(tmp_path, save_every=2, journal=False, save_in_background=False,
                         grpo={"kl_coef": 0.0, "track_kl": False})
    core = PolicyCore(config)
    _train(core, range(3))
    assert not (tmp_path / JOURNAL_DIR).exists()
    assert PolicyCore(config).version == 2


def test_periodic_saves_need_a_journal_bound(make_config: Callable[..., PolicyConfig], tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="policy.journal with policy.save_every 0"):
        make_config(tmp_path, save_every=0)
    assert make_config(tmp_path, save_every=0, journal=False).save_every == 0


def _weights(core: PolicyCore) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in core.model.named_parameters()}


def test_restore_rolls_back_as_the_next_version_and_survives_a_restart(
        tmp_path: Path, make_config: Callable[..., PolicyConfig]) -> None:
    """The reward-hacking alarm's rollback: the newest kept checkpoint at or below a version becomes the next
    version (weights and optimizer state), checkpointed before the reply; a retry answers the recorded reply, also
    after a restart; a checkpoint of the branch a restore left behind is never restored."""
    config = make_config(tmp_path, save_every=3, keep_checkpoints=3, save_in_background=False,
                         optim={"lr": 1e-2, "warmup_steps": 4})
    core = PolicyCore(config)
    initial = _weights(core)
    _train(core, range(3))
    at_v3 = _weights(core)
    _train(core, range(3, 7))  # checkpoints v3 and v6, the journal holds v7
    assert core.version == 7

    restored = core.restore("run/rollback/1", at_most_version=5)
    assert (restored.restored_version, restored.version, restored.replayed) == (3, 8, False)
    assert Path(restored.checkpoint).name == "v00000008" and Path(restored.checkpoint).is_dir()
    assert all(torch.equal(p, at_v3[name]) for name, p in core.model.named_parameters())
    assert core.trainer.updates == 3  # the optimizer state of v3: the warm-up goes on from there
    assert UpdateJournal(tmp_path / JOURNAL_DIR).versions() == []  # v8 is on disk: nothing to apply again
    assert core.restore("run/rollback/1", at_most_version=5) == restored.__class__(3, 8, restored.checkpoint, True)

    resumed = PolicyCore(config)  # a restart comes back at the restored version, with the key's reply
    assert resumed.version == 8 and resumed.trainer.updates == 3
    assert all(torch.equal(p, at_v3[name]) for name, p in resumed.model.named_parameters())
    assert resumed.restore("run/rollback/1", at_most_version=5).replayed
    _train(resumed, range(7, 8))  # v9, checkpointed; kept: v6 (the abandoned branch), v8, v9

    # v4-v7 were left behind: v6 is kept but is not this branch's, so at most 7 reaches the initial model.
    again = resumed.restore("run/rollback/2", at_most_version=7)
    assert (again.restored_version, again.version) == (0, 10)
    assert all(torch.equal(p, initial[name]) for name, p in resumed.model.named_parameters())
    assert resumed.trainer.updates == 0
    assert resumed.train("j/after", *_rollout(resumed, 9), group_size=4).version == 11  # trains on from there

    with pytest.raises(ValueError, match="was a Restore's"):  # keys are one namespace: never answered across kinds
        resumed.train("run/rollback/1", *_rollout(resumed, 9), group_size=4)
    with pytest.raises(ValueError, match="was a Train's"):
        resumed.restore("j/after", 3)
    with pytest.raises(ValueError, match="idempotency key"):
        resumed.restore("", 3)
    with pytest.raises(ValueError, match="at least 0"):
        resumed.restore("run/rollback/3", -1)
    assert resumed.version == 11  # nothing was applied

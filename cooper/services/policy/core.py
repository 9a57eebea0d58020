"""The policy service's state and operations, without gRPC: model, reference, trainer, engine, versions, keys.

`PolicyCore` is what `server.py` translates messages to and what `bench/policy.py` calls in-process. Every
operation holds one lock: generation and training share the weights, so they must not interleave. Except with
rollouts ahead of training (`behind` = run.max_staleness > 0): the engine then samples from weights of its own, a
version the trainer already left when asked (sampler.py), and Generate runs while Train does.

Versions: 0 is the initial model; each applied `train` or `restore` adds 1. Idempotency (cooper/runtime/ledger.py):
the results of the most recent `KEY_HISTORY` keys are kept (and checkpointed), so a retried `train` returns the
recorded result and trains nothing, also after a restart from a checkpoint. The version, the keyed results and the
journal's replay are kept by a `DurableTrainer` (cooper/runtime/durable_trainer.py), as VerifyRM's are.

Durability (policy.save_every, save_in_background, journal): every applied `train` is appended to the update journal
before it returns; a full checkpoint is written every `save_every` updates, from an in-memory copy on a background
thread. Start-up loads the newest checkpoint and applies the journaled updates after it again, so the service comes
back at the version it last answered, with those keys' recorded results. That trades a full checkpoint per update
(seconds to minutes at 0.5B-1.5B, on the training path) for a journal entry per update (the rollout's token ids) and
a copy of the state every `save_every` updates.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import POLICY, checkpoint_name, latest_checkpoint, read_state
from cooper.runtime.devices import resolve_autocast, resolve_device
from cooper.runtime.durability import Durability
from cooper.runtime.durable_trainer import DurableTrainer
from cooper.runtime.ledger import SavedCheckpoint
from cooper.runtime.models import load_causal_lm, resolve_model
from cooper.services.policy.checks import check_rollout, check_staleness
from cooper.services.policy.engine import Completion, RolloutEngine, SamplingParams
from cooper.services.policy.errors import GroupLost, NotOffered, RankFailure, RanksRestarted
from cooper.services.policy.messages import PolicyInfo, RestoreResult, TrainResult
from cooper.services.policy.models import load_reference
from cooper.services.policy.placement import launched
from cooper.services.policy.sampler import BehindSampler, CurrentSampler
from cooper.services.policy.trainer import PolicyUpdater, RolloutSample, rollout_samples, rollout_tensors
from cooper.services.policy.updaters import load_weights_in_place, new_updater, resolve_world_size

log = logging.getLogger("cooper.policy")

KEY_HISTORY = 256


def build_engine(cfg: PolicyConfig, model: Any, tokenizer: Any, autocast: torch.dtype | None, path: str,
                 own_weights: bool = False) -> RolloutEngine:
    """The rollout engine; `own_weights`: it samples from a copy of its own (vLLM always does; the transformers
    engine then runs in a process of its own, rollout_process.py), else from `model` itself."""
    if cfg.engine == "vllm":
        # Imported here only: vLLM is the `gpu` extra and must never be imported on CPU code paths.
        from cooper.services.policy.vllm_engine import VLLMEngine

        return VLLMEngine(model, tokenizer, path, cfg)
    if own_weights:
        from cooper.services.policy.rollout_process import RolloutProcess

        return RolloutProcess(model, tokenizer, cfg.generate_batch_size, autocast,
                              cfg.rollout_threads or cfg.torch_threads)
    from cooper.services.policy.hf_engine import TransformersEngine

    return TransformersEngine(model, tokenizer, cfg.generate_batch_size, autocast)


def journal_record(key: str, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int,
                   metrics: dict[str, float]) -> dict[str, Any]:
    """One applied Train as the update journal keeps it: what `_replay_journal` needs to apply it again, and the
    result it answered. Rewards in float64, so the replay sees exactly the floats the request carried."""
    return {"key": key, "rollout": rollout_tensors(samples),
            "rewards": torch.tensor(list(rewards), dtype=torch.float64), "group_size": group_size, "metrics": metrics}


PolicyRecord = TrainResult | RestoreResult
"""What the ledger keeps per key: the Train or the Restore that applied it, as it answered."""


def encode_record(record: PolicyRecord) -> dict[str, Any]:
    return {key: value for key, value in asdict(record).items() if key != "replayed"}


def decode_record(saved: Mapping[str, Any]) -> PolicyRecord:
    # Checkpoints written before the records were typed keep a Restore's version under "metrics".
    restored = saved.get("restored_version", saved.get("metrics", {}).get("restored_version"))
    if restored is not None:
        return RestoreResult(int(restored), int(saved["version"]), str(saved.get("checkpoint", "")), False)
    return TrainResult(dict(saved["metrics"]), int(saved["version"]), False)


class PolicyCore:
    """Loads the policy (from the latest checkpoint in `cfg.checkpoint_dir` when there is one) and serves it.
    `behind` (run.max_staleness): how many versions before the trainer's Generate can still sample from."""

    def __init__(self, cfg: PolicyConfig, behind: int = 0):
        self.cfg = cfg
        self.behind = behind
        if cfg.torch_threads:
            torch.set_num_threads(cfg.torch_threads)
        self.device = resolve_device(cfg.device, "policy.device")
        self.place = launched()
        """This process's place in a group a launcher started on several machines (None: the service runs alone, and
        starts its own ranks when world_size > 1)."""
        self.world_size = resolve_world_size(cfg.world_size, self.device, self.place)
        self.autocast = resolve_autocast(cfg.dtype, self.device)
        self.initial_path = resolve_model(cfg.model, "causal")
        self.durable: DurableTrainer[PolicyRecord] = DurableTrainer(
            Durability(cfg.checkpoint_dir, POLICY, save_every=cfg.save_every, keep_checkpoints=cfg.keep_checkpoints,
                       journal=cfg.journal, service="policy", rebuild=behind),
            KEY_HISTORY, encode_record, decode_record)
        checkpoint = self.durable.start()
        weights_path = str(checkpoint) if checkpoint else self.initial_path
        self.tokenizer = AutoTokenizer.from_pretrained(weights_path)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = load_causal_lm(weights_path, torch.float32, self.device)
        self.reference = None
        if self.world_size == 1:  # ranks hold their own shards of the reference
            self.reference = load_reference(cfg, self.initial_path, self.autocast, self.device)
        self.trainer = self._new_updater(weights_path, checkpoint)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        if checkpoint:
            self._resume(checkpoint)
        self._lock = threading.Lock()
        """The trainer's: Train, Save, Restore; and Generate unless the engine samples from weights of its own."""
        self.engine = build_engine(cfg, self.model, self.tokenizer, self.autocast, weights_path,
                                   own_weights=bool(behind))
        # The sampling route, chosen once: from the trainer's weights under its lock, or from versions kept behind it.
        self.sampler: CurrentSampler | BehindSampler = (
            BehindSampler(self.engine, behind, self._lock) if behind else CurrentSampler(self.engine, self._lock))
        self._replay_journal()
        self.parameters = sum(p.numel() for p in self.model.parameters())

    @property
    def version(self) -> int:
        return self.durable.sequence

    @property
    def last_key(self) -> str:
        return self.durable.last_key

    def _resume(self, checkpoint: Path) -> None:
        self.durable.resume(checkpoint, read_state(checkpoint))
        log.info("policy resumed from %s (version %d, last key %r)", checkpoint, self.version, self.last_key)

    def _replay_journal(self) -> None:
        """Apply again, in order, the journaled updates after the loaded checkpoint, each with its recorded result.

        The update is a deterministic function of the weights, the AdamW state and the journaled rollout (no dropout,
        no sampling), so on the same kind of CPU the weights come back bit for bit; on a GPU to within its kernels'
        rounding. The recorded result (what Train answered) is what a retried Train gets, not the replay's."""

        def apply(entry: dict[str, Any]) -> TrainResult:
            self.sampler.keep(self.version, self.model)  # versions behind the trainer come back too (their journal)
            self.trainer.train_step(rollout_samples(entry["rollout"]), entry["rewards"].tolist(), entry["group_size"])
            return TrainResult(entry["metrics"], self.version + 1, False)

        applied = self.durable.replay(apply)
        if applied:
            self.sampler.synced()
            log.info("policy applied %d journaled updates again (now version %d, last key %r)", applied,
                     self.version, self.last_key)

    def _new_updater(self, weights_path: str, checkpoint: Path | None) -> PolicyUpdater:
        return new_updater(self.cfg, self.world_size, self.model, self.reference, self.tokenizer.pad_token_id,
                           self.autocast, self.place, weights_path, self.initial_path, checkpoint)

    def _restart_ranks(self, failure: RankFailure) -> RanksRestarted | GroupLost:
        """After a rank failed: kill the group, load the latest checkpoint into rank 0's model (in place, so the
        engine keeps its module) and start the ranks again from it. Returns the error the failed call raises. A group
        a launcher started on several machines cannot be started again from here: GroupLost, and its launcher
        restarts every process."""
        self.trainer.kill()
        if self.place is not None:
            log.error("policy: %s; the group cannot go on, and this service stops so that its launcher starts every "
                      "rank again (from the latest checkpoint and the update journal)", failure)
            return GroupLost(f"{failure}; the update was not applied. The policy's {self.world_size} ranks are "
                             "restarting from the latest checkpoint; retry the call")
        log.error("policy: %s; restarting the ranks from the latest checkpoint", failure)
        self.durable.wait()  # its copy was taken before the failure: let it land, it is the latest
        checkpoint = latest_checkpoint(self.cfg.checkpoint_dir)
        weights_path = str(checkpoint) if checkpoint else self.initial_path
        load_weights_in_place(self.model, weights_path)
        # Version and keys go back with the weights, before the ranks start: if starting them fails too, what this
        # service reports still matches what it samples from, and the next Train tries the start again.
        if checkpoint:
            self._resume(checkpoint)
        else:
            self.durable.reset()
        self.sampler.synced()
        self.trainer = self._new_updater(weights_path, checkpoint)
        self._replay_journal()
        return RanksRestarted(
            f"{failure}; the update was not applied. The policy service restarted its {self.world_size} ranks from "
            f"{weights_path} (version {self.version}); retry the call"
        )

    def close(self) -> None:
        """Let a background checkpoint finish; stop the other ranks (world_size > 1)."""
        with self._lock:
            self.durable.wait()
            self.trainer.close()
            self.engine.close()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, version: int | None = None
                 ) -> tuple[list[list[Completion]], int]:
        """`sampling.n` completions per prompt, in prompt order, and the version that sampled them: `version`
        (VersionNotHeld when the service does not hold it), or the current one when None."""
        self.durable.check_journaled()
        return self.sampler.generate(list(prompts), sampling, version, lambda: self.version, self.model)

    def train(self, key: str, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int,
              sampled_version: int | None = None) -> TrainResult:
        """Apply one GRPO update for `key`, or return the recorded result if `key` was applied before.
        `sampled_version`: the policy version that sampled the rollout (None: the trainer's own, as in-process
        callers that sample and train in turn); StaleRollout when it is not one this trainer may train on."""
        if not key:
            raise ValueError("Train needs an idempotency key (key.run_id and key.step)")
        with self._lock:
            recorded = self.durable.recorded(key)
            if isinstance(recorded, RestoreResult):
                raise ValueError(f"key {key!r} was a Restore's; give the Train a key of its own")
            if recorded is not None:
                return replace(recorded, metrics=dict(recorded.metrics), replayed=True)
            check_rollout(samples, rewards, group_size, self.vocab_size)
            check_staleness(samples, self.version if sampled_version is None else sampled_version, self.version,
                            self.behind, self.cfg.grpo.rollout_is_cap)
            try:
                # Rollouts still to come may sample this version after the update leaves it.
                self.sampler.keep(self.version, self.model)
                metrics = self.trainer.train_step(samples, rewards, group_size)
                # Journaled before the answer: an update this service answered is never lost. A failed write leaves
                # this service refusing every call until a restart (UnjournaledUpdate): the key is not recorded yet.
                result = TrainResult(metrics, self.version + 1, False)
                self.durable.commit(key, result, journal_record(key, samples, rewards, group_size, metrics))
                self.sampler.synced()
                if self.durable.due():
                    self._save("", background=self.cfg.save_in_background)
            except RankFailure as failure:  # only with world_size > 1
                raise self._restart_ranks(failure) from failure
            return replace(result, metrics=dict(metrics))

    def restore(self, key: str, at_most_version: int) -> RestoreResult:
        """Roll back to the newest kept checkpoint at or below `at_most_version` (the initial model when none is
        kept): its weights and optimizer state become version `version + 1`, checkpointed before this returns, so a
        crash either loses the restore (the caller's retry applies it) or keeps it. Versions only go up: every
        version a caller has seen still names one set of weights. How far back it can reach is
        policy.keep_checkpoints x policy.save_every versions (the reward-hacking alarm's rollback)."""
        if not key:
            raise ValueError("Restore needs an idempotency key (key.run_id and key.step)")
        if at_most_version < 0:
            raise ValueError(f"at_most_version must be at least 0 (got {at_most_version})")
        with self._lock:
            recorded = self.durable.recorded(key)
            if isinstance(recorded, TrainResult):
                raise ValueError(f"key {key!r} was a Train's; give the Restore a key of its own")
            if recorded is not None:
                return replace(recorded, replayed=True)
            if self.place is not None:
                raise NotOffered("Restore is not available yet for a policy launched across machines "
                                 "(torchrun); run the reward-hacking alarm with alarm.action=warn there")
            if self.sampler.behind:
                raise NotOffered("Restore needs run.max_staleness=0: the versions kept behind the trainer "
                                 "would name weights of two histories")
            self.durable.wait()  # a checkpoint still being written may be the one to restore
            target, restored_version = self.durable.rollback_target(min(at_most_version, self.version))
            weights_path = str(target) if target else self.initial_path
            load_weights_in_place(self.model, weights_path)
            self.trainer.close()
            # The checkpoint's optimizer state with its weights (the initial model has none: a fresh optimizer).
            self.trainer = self._new_updater(weights_path, target)
            self.durable.abandon_after(restored_version)
            # The checkpoint's path is recorded with the key and saved with it: a retry after a restart answers the same.
            checkpoint = str(Path(self.cfg.checkpoint_dir) / checkpoint_name(self.version + 1))
            result = RestoreResult(restored_version, self.version + 1, checkpoint, False)
            self.durable.commit_saved(key, result)
            self.sampler.synced()
            self._save(f"restored-v{restored_version}")
            log.warning("policy restored the weights of version %d (%s) as version %d", restored_version,
                        weights_path, self.version)
            return result

    def save(self, tag: str = "") -> SavedCheckpoint:
        with self._lock:
            try:
                return SavedCheckpoint(self._save(tag), self.version)
            except RankFailure as failure:  # only with world_size > 1
                raise self._restart_ranks(failure) from failure

    def save_if_unsaved(self, tag: str) -> str | None:
        """Save when updates were applied since the last checkpoint (policy.save_on_stop); None when nothing was."""
        with self._lock:
            return self.durable.save_if_unsaved(lambda: self._save_unless_gone(tag))

    def _save_unless_gone(self, tag: str) -> str | None:
        if self.trainer.closed:  # a group lost across machines: no state to gather
            log.warning("policy: the ranks are gone, so nothing is saved on stop; the update journal holds every "
                        "update since the last checkpoint")
            return None
        return self._save(tag)

    def wait_for_saves(self) -> None:
        """Return once no background checkpoint is being written."""
        self.durable.wait()

    def _save(self, tag: str, background: bool = False) -> str:
        """Write a checkpoint of the current state and return its directory; `background`: from a copy, on the
        background thread (returns at once; the directory is complete once the write lands)."""
        state = self.durable.state(tag, version=self.version, model=self.cfg.model)
        return self.durable.save(self.model, self.tokenizer, self.trainer.optimizer_state, state, background)

    def info(self) -> PolicyInfo:
        # No lock: a snapshot of plain attributes, so Info answers at once even during a long Train.
        return PolicyInfo(self.cfg.model, self.version, self.parameters, str(self.device), self.engine.name,
                          self.last_key, self.durable.latest)

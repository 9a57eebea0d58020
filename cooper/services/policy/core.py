"""The policy service's state and operations, without gRPC: model, reference, trainer, engine, versions, keys.

`PolicyCore` is what `server.py` translates messages to and what `bench/policy.py` calls in-process. Every
operation holds one lock: generation and training share the weights, so they must not interleave. Except with
rollouts ahead of training (`behind` = run.max_staleness > 0): the engine then samples from weights of its own, a
version the trainer already left when asked (sampler.py), and Generate runs while Train does.

Versions: 0 is the initial model; each applied `train` adds 1. Idempotency (cooper/runtime/ledger.py): the results of
the most recent `KEY_HISTORY` keys are kept (and checkpointed), so a retried `train` returns the recorded result and
trains nothing, also after a restart from a checkpoint.

Durability (policy.save_every, save_in_background, journal): every applied `train` is appended to the update journal
before it returns; a full checkpoint is written every `save_every` updates, from an in-memory copy on a background
thread. Start-up loads the newest checkpoint and applies the journaled updates after it again, so the service comes
back at the version it last answered, with those keys' recorded results. That trades a full checkpoint per update
(seconds to minutes at 0.5B-1.5B, on the training path) for a journal entry per update (the rollout's token ids) and
a copy of the state every `save_every` updates.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from cooper.config import PolicyConfig
from cooper.runtime.checkpoint import (
    POLICY,
    checkpoint_name,
    complete_checkpoints,
    latest_checkpoint,
    read_optimizer_state,
    read_state,
)
from cooper.runtime.devices import resolve_autocast, resolve_device
from cooper.runtime.durability import Durability
from cooper.runtime.ledger import Ledger
from cooper.runtime.models import load_causal_lm, resolve_model
from cooper.services.policy.engine import Completion, RolloutEngine, SamplingParams
from cooper.services.policy.errors import (
    GroupLost,
    NotOffered,
    RankFailure,
    RanksRestarted,
    StaleRollout,
    VersionNotHeld,
)
from cooper.services.policy.messages import RestoreResult, TrainResult
from cooper.services.policy.models import load_reference
from cooper.services.policy.placement import Placement, launched
from cooper.services.policy.sampler import BehindSampler
from cooper.services.policy.trainer import (
    GRPOTrainer,
    PolicyUpdater,
    RolloutSample,
    rollout_samples,
    rollout_tensors,
)

log = logging.getLogger("cooper.policy")

KEY_HISTORY = 256


def resolve_world_size(world_size: int | str, device: torch.device, place: Placement | None = None) -> int:
    """policy.world_size as a number of ranks; more ranks than devices is an error that says what to change. Under a
    launcher (`place`) the group is the launcher's: policy.world_size is auto, 1 (the default) or its WORLD_SIZE."""
    if place is not None:
        if world_size not in ("auto", 1, place.world_size):
            raise RuntimeError(f"policy.world_size is {world_size} but the launcher started {place.world_size} ranks "
                               "(WORLD_SIZE); set policy.world_size=auto under torchrun")
        ranks, here = place.world_size, place.local_world_size
    elif world_size == "auto":
        return torch.cuda.device_count() if device.type == "cuda" else 1
    else:
        ranks = here = int(world_size)
    node = f" ({here} on this node)" if place is not None else ""
    if device.type == "cuda" and here > torch.cuda.device_count():
        raise RuntimeError(
            f"policy.world_size is {ranks}{node} but {torch.cuda.device_count()} CUDA devices are visible; lower "
            "policy.world_size (or set it to auto) or give the service more GPUs (compose: POLICY_GPUS, Kubernetes: "
            "the pod's nvidia.com/gpu)"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if device.type == "cpu" and here > cores:
        raise RuntimeError(
            f"policy.world_size is {ranks}{node} but only {cores} CPU cores are available to run the ranks on; "
            "lower policy.world_size"
        )
    return ranks


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
        self.durable = Durability(cfg.checkpoint_dir, POLICY, save_every=cfg.save_every,
                                  keep_checkpoints=cfg.keep_checkpoints, journal=cfg.journal,
                                  service="policy", rebuild=behind)
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
        self.version = 0
        self.ledger: Ledger[dict[str, Any]] = Ledger(KEY_HISTORY)
        """Per key: {"metrics", "version"} of the Train or Restore that applied it (a Restore's also "checkpoint")."""
        self.abandoned: list[tuple[int, int]] = []
        """Version ranges a restore left behind (first, last): their checkpoints are another branch's weights."""
        if checkpoint:
            self._restore_state(checkpoint)
        self._lock = threading.Lock()
        """The trainer's: Train, Save, Restore; and Generate unless the engine samples from weights of its own."""
        self.engine = build_engine(cfg, self.model, self.tokenizer, self.autocast, weights_path,
                                   own_weights=bool(behind))
        self.sampler = BehindSampler(self.engine, behind, self._lock) if behind else None
        self._replay_journal()
        self.parameters = sum(p.numel() for p in self.model.parameters())

    def _restore_state(self, checkpoint: Any) -> None:
        state = read_state(checkpoint)
        self.version = int(state["version"])
        self.ledger = Ledger(KEY_HISTORY, state.get("history", {}), state.get("last_key", ""))
        self.abandoned = [(int(first), int(last)) for first, last in state.get("abandoned", [])]
        self.durable.loaded(checkpoint, self.version)
        log.info("policy resumed from %s (version %d, last key %r)", checkpoint, self.version, self.last_key)

    def _replay_journal(self) -> None:
        """Apply again, in order, the journaled updates after the loaded checkpoint, each with its recorded result.

        The update is a deterministic function of the weights, the AdamW state and the journaled rollout (no dropout,
        no sampling), so on the same kind of CPU the weights come back bit for bit; on a GPU to within its kernels'
        rounding. The recorded result (what Train answered) is what a retried Train gets, not the replay's."""
        entries = self.durable.entries_after(self.version, self.last_key)
        for entry in entries:
            if self.sampler:  # the versions behind the trainer come back too (Durability keeps their journal)
                self.sampler.keep(self.version, self.model)
            self.trainer.train_step(rollout_samples(entry["rollout"]), entry["rewards"].tolist(), entry["group_size"])
            self.version += 1
            self._record(entry["key"], entry["metrics"])
        if entries:
            self._sync_engine()
            log.info("policy applied %d journaled updates again (now version %d, last key %r)", len(entries),
                     self.version, self.last_key)

    @property
    def last_key(self) -> str:
        return self.ledger.last_key

    def _record(self, key: str, metrics: dict[str, float]) -> None:
        self.ledger.record(key, {"metrics": metrics, "version": self.version})

    def _new_updater(self, weights_path: str, checkpoint: Any) -> PolicyUpdater:
        """The updater of `self.model` (loaded from `weights_path`), with the optimizer state of `checkpoint` (None:
        a fresh optimizer): a trainer in this process, or with world_size > 1 the ranks, which hold the sharded
        weights, optimizer and reference and load their shards of `checkpoint` themselves; `self.model` stays rank
        0's full copy, which the engine samples from and checkpoints save (ranks/group.py)."""
        if self.world_size == 1:
            trainer = GRPOTrainer.from_config(self.model, self.reference, self.cfg, self.tokenizer.pad_token_id,
                                              self.autocast)
            if checkpoint:
                trainer.load_optimizer_state(read_optimizer_state(checkpoint))
            return trainer
        # Imported here only: FSDP's modules take about a second to import, which one rank never needs.
        from cooper.services.policy.ranks.control import RankSpec
        from cooper.services.policy.ranks.group import RankGroup

        spec = RankSpec(self.cfg, self.world_size, weights_path, self.initial_path,
                        str(checkpoint) if checkpoint else None, self.tokenizer.pad_token_id)
        return RankGroup(spec, self.model, self.place)

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
        self._load_weights_in_place(weights_path)
        # Version and keys go back with the weights, before the ranks start: if starting them fails too, what this
        # service reports still matches what it samples from, and the next Train tries the start again.
        if checkpoint:
            self._restore_state(checkpoint)
        else:
            self.version, self.ledger, self.abandoned = 0, Ledger(KEY_HISTORY), []
            self.durable.loaded("", 0)
        self._sync_engine()
        self.trainer = self._new_updater(weights_path, checkpoint)
        self._replay_journal()
        return RanksRestarted(
            f"{failure}; the update was not applied. The policy service restarted its {self.world_size} ranks from "
            f"{weights_path} (version {self.version}); retry the call"
        )

    def _load_weights_in_place(self, weights_path: str) -> None:
        """The weights of `weights_path` into `self.model` (in place: the engine and the ranks keep its module)."""
        fresh = load_causal_lm(weights_path, torch.float32, torch.device("cpu"))
        self.model.load_state_dict(fresh.state_dict())
        del fresh

    def close(self) -> None:
        """Let a background checkpoint finish; stop the other ranks (world_size > 1)."""
        with self._lock:
            self.durable.wait()
            self.trainer.close()
            self.engine.close()

    def _sync_engine(self) -> None:
        """After the trainer's weights changed: the engine samples the new ones. An engine with weights of its own
        behind the trainer loads a version when a Generate asks for it instead (sampler.py)."""
        if self.sampler is None:
            self.engine.sync_weights()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams, version: int | None = None
                 ) -> tuple[list[list[Completion]], int]:
        """`sampling.n` completions per prompt, in prompt order, and the version that sampled them: `version`
        (VersionNotHeld when the service does not hold it), or the current one when None."""
        self.durable.check_journaled()
        if self.sampler is not None:
            wanted = self.version if version is None else version
            if not prompts:
                return [], wanted
            return self.sampler.generate(list(prompts), sampling, wanted, lambda: self.version, self.model), wanted
        with self._lock:
            if version is not None and version != self.version:
                raise VersionNotHeld(f"policy version {version} is not held here: the service is at version "
                                     f"{self.version} and keeps no other (run.max_staleness 0)")
            if not prompts:
                return [], self.version
            return self.engine.generate(list(prompts), sampling), self.version

    def train(self, key: str, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int,
              sampled_version: int | None = None) -> TrainResult:
        """Apply one GRPO update for `key`, or return the recorded result if `key` was applied before.
        `sampled_version`: the policy version that sampled the rollout (None: the trainer's own, as in-process
        callers that sample and train in turn); StaleRollout when it is not one this trainer may train on."""
        if not key:
            raise ValueError("Train needs an idempotency key (key.run_id and key.step)")
        with self._lock:
            self.durable.check_journaled()
            recorded = self.ledger.recorded(key)
            if recorded is not None:
                if "restored_version" in recorded["metrics"]:
                    raise ValueError(f"key {key!r} was a Restore's; give the Train a key of its own")
                return TrainResult(dict(recorded["metrics"]), int(recorded["version"]), True)
            self._check_rollout(samples, rewards, group_size)
            self._check_staleness(samples, self.version if sampled_version is None else sampled_version)
            try:
                if self.sampler:  # rollouts still to come may sample this version after the update leaves it
                    self.sampler.keep(self.version, self.model)
                metrics = self.trainer.train_step(samples, rewards, group_size)
                self.version += 1
                # Before the answer: an update this service answered is never lost. A failed write leaves this
                # service refusing every call until a restart (UnjournaledUpdate): the key is not recorded yet.
                self.durable.record(self.version, self.last_key,
                                    journal_record(key, samples, rewards, group_size, metrics))
                self._sync_engine()
                self._record(key, metrics)
                if self.durable.due(self.version):
                    self._save("", background=self.cfg.save_in_background)
            except RankFailure as failure:  # only with world_size > 1
                raise self._restart_ranks(failure) from failure
            return TrainResult(metrics, self.version, False)

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
            self.durable.check_journaled()
            recorded = self.ledger.recorded(key)
            if recorded is not None:
                if "restored_version" not in recorded["metrics"]:
                    raise ValueError(f"key {key!r} was a Train's; give the Restore a key of its own")
                return RestoreResult(int(recorded["metrics"]["restored_version"]), int(recorded["version"]),
                                     str(recorded.get("checkpoint", "")), True)
            if self.place is not None:
                raise NotOffered("Restore is not available yet for a policy launched across machines "
                                        "(torchrun); run the reward-hacking alarm with alarm.action=warn there")
            if self.sampler is not None:
                raise NotOffered("Restore needs run.max_staleness=0: the versions kept behind the trainer "
                                        "would name weights of two histories")
            self.durable.wait()  # a checkpoint still being written may be the one to restore
            target, restored_version = self._restore_target(min(at_most_version, self.version))
            weights_path = str(target) if target else self.initial_path
            self._load_weights_in_place(weights_path)
            self.trainer.close()
            # The checkpoint's optimizer state with its weights (the initial model has none: a fresh optimizer).
            self.trainer = self._new_updater(weights_path, target)
            if restored_version < self.version:
                self.abandoned.append((restored_version + 1, self.version))
            self.version += 1
            checkpoint = str(Path(self.cfg.checkpoint_dir) / checkpoint_name(self.version))
            # The checkpoint's path is recorded with the key and saved with it: a retry after a restart answers the same.
            self.ledger.record(key, {"metrics": {"restored_version": float(restored_version)}, "version": self.version,
                                     "checkpoint": checkpoint})
            self._sync_engine()
            self._save(f"restored-v{restored_version}")
            log.warning("policy restored the weights of version %d (%s) as version %d", restored_version,
                        weights_path, self.version)
            return RestoreResult(restored_version, self.version, checkpoint, False)

    def _restore_target(self, at_most_version: int) -> tuple[Path | None, int]:
        """The newest complete checkpoint of this branch at or below `at_most_version` and its version (from its
        name, "v<version>"); (None, 0): the initial model."""
        for path in reversed(complete_checkpoints(self.cfg.checkpoint_dir)):
            version = int(path.name[1:])
            if version <= at_most_version and not any(first <= version <= last for first, last in self.abandoned):
                return path, version
        return None, 0

    def _check_staleness(self, samples: Sequence[RolloutSample], sampled_version: int) -> None:
        """StaleRollout unless a rollout sampled by `sampled_version` may be trained on now.
        A rollout behind the trainer is trained with each token weighted by min(pi_old / pi_sampled, cap)
        (trainer.py), so it needs every completion's sampling log-probs: without them the update would silently
        treat it as sampled by the current weights (weight 1)."""
        behind = self.version - sampled_version
        if behind < 0:
            raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, but the trainer is at "
                               f"version {self.version}: a version not made yet")
        if behind > self.behind:
            raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, {behind} versions behind "
                               f"the trainer's version {self.version}; run.max_staleness={self.behind} allows at "
                               f"most {self.behind}")
        if behind:
            missing = sum(not s.has_rollout_logprobs for s in samples)
            if missing:
                raise StaleRollout(f"the rollout was sampled by policy version {sampled_version}, behind the trainer's "
                                   f"version {self.version}, and {missing} of its {len(samples)} completions have no "
                                   "sampling log-probs (one per token): the importance correction needs them; send "
                                   "the completions as Generate returned them")
            if self.cfg.grpo.rollout_is_cap is None:
                raise StaleRollout("a rollout behind the trainer needs policy.grpo.rollout_is_cap (the importance "
                                   "correction's cap); run.max_staleness > 0 sets it to 2.0 when unset")

    def _check_rollout(self, samples: Sequence[RolloutSample], rewards: Sequence[float], group_size: int) -> None:
        if group_size < 2:
            raise ValueError(f"group_size must be at least 2 (got {group_size}): a group of one has no relative signal")
        if not samples or len(samples) % group_size:
            raise ValueError(f"{len(samples)} completions do not split into groups of {group_size}")
        if len(rewards) != len(samples):
            raise ValueError(f"{len(samples)} completions but {len(rewards)} rewards; give one reward per completion")
        for start in range(0, len(samples), group_size):
            if any(s.prompt_token_ids != samples[start].prompt_token_ids for s in samples[start : start + group_size]):
                raise ValueError(
                    f"completions {start}..{start + group_size - 1} do not share one prompt: send the rollout "
                    "grouped by prompt, `group_size` per prompt, as Generate returned it"
                )
        for i, s in enumerate(samples):
            ids = s.prompt_token_ids + s.completion_token_ids
            if not s.prompt_token_ids or any(t < 0 or t >= self.vocab_size for t in ids):
                raise ValueError(f"completion {i} has an empty prompt or a token id outside [0, {self.vocab_size})")

    def save(self, tag: str = "") -> tuple[str, int]:
        with self._lock:
            try:
                return self._save(tag), self.version
            except RankFailure as failure:  # only with world_size > 1
                raise self._restart_ranks(failure) from failure

    def save_if_unsaved(self, tag: str) -> str | None:
        """Save when updates were applied since the last checkpoint (policy.save_on_stop); None when nothing was."""
        with self._lock:
            self.durable.wait()
            if self.durable.unjournaled_on_stop():
                return None
            if self.trainer.closed:  # a group lost across machines: no state to gather
                log.warning("policy: the ranks are gone, so nothing is saved on stop; the update journal holds every "
                            "update since the last checkpoint")
                return None
            return self._save(tag) if self.durable.unsaved(self.version) else None

    def wait_for_saves(self) -> None:
        """Return once no background checkpoint is being written."""
        self.durable.wait()

    def _save(self, tag: str, background: bool = False) -> str:
        """Write a checkpoint of the current state and return its directory; `background`: from a copy, on the
        background thread (returns at once; the directory is complete once the write lands)."""
        state = {"version": self.version, "last_key": self.last_key, "history": self.ledger.results(), "tag": tag,
                 "model": self.cfg.model, "abandoned": [list(r) for r in self.abandoned]}
        return self.durable.save(self.model, self.tokenizer, self.trainer.optimizer_state, state, self.version,
                                 background)

    def info(self) -> dict[str, Any]:
        # No lock: a snapshot of plain attributes, so Info answers at once even during a long Train.
        return {
            "model": self.cfg.model,
            "version": self.version,
            "parameters": self.parameters,
            "device": str(self.device),
            "engine": self.engine.name,
            "last_key": self.last_key,
            "checkpoint": self.durable.latest,
        }

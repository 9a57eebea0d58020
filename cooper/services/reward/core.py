"""The reward model's state and every operation on it, synchronous: VerifyRM + versions + idempotency + checkpoints.

One RewardCore lives on one thread of one process (runner.py decides which: a thread of the serving process or a
child process of its own), and runs one call at a time, in the order the calls were submitted. That order is the
whole concurrency story: a scoring batch never sees half-updated weights because an update is just another call.
No asyncio, Prometheus or transport here; timings and versions are returned for the caller to record.

A read replica (reward.role=replica) swaps in the trainer's checkpoints in two steps, so that scoring pauses only
for a copy and never for disk reads: `stage_checkpoint` reads and checks the new weights on a loader thread while
forward passes go on, then `swap_staged`, queued like an update, copies them into the model's tensors in place.
Being one call of the model thread, the swap is never seen half-done by a score.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, astuple, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from cooper.config import BatchingConfig, RewardConfig
from cooper.runtime import checkpoint
from cooper.runtime.checkpoint import REWARD
from cooper.runtime.durability import Durability
from cooper.runtime.durable_trainer import DurableTrainer
from cooper.runtime.ledger import SavedCheckpoint
from cooper.runtime.models import resolve_model
from cooper.services.reward.items import ModelInfo, PreferencePair, ScoreItem, UpdateResult
from cooper.services.reward.serving_defaults import CALIBRATION_TOKENS, with_batching
from cooper.services.reward.verify_rm import VerifyRM

log = logging.getLogger("cooper.reward")

RECORDED_RESULTS = 64  # Update results kept for replay; the orchestrator only ever retries its latest steps

@dataclass(frozen=True)
class BatchScores:
    """Logits of one scoring batch, in item order, all from model `version`, and the time of each forward pass;
    `tokens`, each item's input tokens, where the core tokenized the batch itself (score_texts)."""

    logits: list[float]
    version: int
    forward_s: list[float] = field(default_factory=list)
    tokens: list[int] | None = None


class RewardCore:
    """Build with `RewardCore.load(config)`; not thread-safe (see the module docstring)."""

    def __init__(self, rm: VerifyRM, config: RewardConfig, durable: Durability, state: dict[str, Any] | None = None,
                 checkpoint_path: str = ""):
        self.rm = rm
        self.config = config
        self.batching_reasons: list[str] = []
        self.spread_waits_ms: list[float] | None = None  # per batch size, where the wait is chosen (with_batching)
        """Why load chose the batching settings the config left unset (empty when it set them all)."""
        self.durable: DurableTrainer[UpdateResult] = DurableTrainer(
            durable, RECORDED_RESULTS, asdict, lambda saved: UpdateResult(**saved))
        state = state or {}
        # The pairs of the latest updates (reward.replay_updates), oldest first: trained on again by the next ones.
        self._replay: deque[list[PreferencePair]] = deque(
            ([PreferencePair(**pair) for pair in update] for update in state.get("replay", [])),
            maxlen=config.replay_updates)
        self.tokenizer_source = checkpoint_path or rm.source
        if checkpoint_path:
            self.durable.resume(checkpoint_path, state)
        self._loader: ThreadPoolExecutor | None = None  # replicas: reads staged checkpoints off the model thread
        self._staging: Future[tuple[str, dict[str, Any], dict[str, torch.Tensor]]] | None = None

    @staticmethod
    def durability(config: RewardConfig, writes: bool = True) -> Durability:
        """The trainer's checkpoints and journal (cooper/runtime/durability.py); a replica's only reads checkpoints.
        `writes`: this copy journals and saves (with reward.model_copies, the first copy only)."""
        trainer = config.role == "trainer"
        return Durability(config.checkpoint_dir, REWARD, save_every=config.save_every,
                          keep_checkpoints=config.keep_checkpoints, journal=trainer and config.journal,
                          service="reward",
                          writes=trainer and writes)

    @classmethod
    def load(cls, config: RewardConfig, writes: bool = True) -> RewardCore:
        """The trainer: the latest complete checkpoint under config.checkpoint_dir (else config.model at version 0)
        and the journaled updates after it, applied again. A replica: the latest checkpoint that loads (the trainer
        may delete one meanwhile), without the optimizer state."""
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        core = cls._load_replica(config) if config.role == "replica" else cls._load_trainer(config, writes)
        kernel_reasons: list[str] = []
        if config.cpu_linear != "auto":
            core.rm.use_linear_kernel(config.cpu_linear)
        elif writes:  # first, as the batch calibration times passes; the other copies take this choice
            kernel, why = core.rm.choose_linear_kernel(min(CALIBRATION_TOKENS, config.max_length))
            kernel_reasons = [f"cpu_linear={kernel}: {why}"]
        if writes:  # the other model copies take this one's choice (RewardService.create: use_batching)
            core.config, reasons, core.spread_waits_ms = with_batching(config, core._calibration_pass)
            core.batching_reasons = reasons + kernel_reasons
        return core

    @classmethod
    def _load_trainer(cls, config: RewardConfig, writes: bool) -> RewardCore:
        durable = cls.durability(config, writes)
        latest = durable.start()
        if latest is None:
            rm = VerifyRM.load(resolve_model(config.model, "reward"), config.optim, config.max_length, config.device,
                               config.dtype)
            log.info("reward model %s loaded (version 0, no checkpoint in %s)", config.model, config.checkpoint_dir)
            core = cls(rm, config, durable)
        else:
            rm = VerifyRM.load(str(latest), config.optim, config.max_length, config.device, config.dtype)
            rm.load_optimizer_state(checkpoint.read_optimizer_state(latest, rm.device))
            core = cls._from_checkpoint(rm, config, durable, latest)
        core._apply_journal()
        return core

    @classmethod
    def _load_replica(cls, config: RewardConfig) -> RewardCore:
        durable = cls.durability(config)
        candidates = checkpoint.complete_checkpoints(config.checkpoint_dir, REWARD)[::-1]
        for latest in candidates:
            try:
                rm = VerifyRM.load(str(latest), config.optim, config.max_length, config.device, config.dtype,
                                   trains=False)
                return cls._from_checkpoint(rm, config, durable, latest)
            except Exception as err:
                if latest == candidates[-1]:
                    raise
                log.warning("replica: checkpoint %s does not load (%s); trying the one before", latest, err)
        rm = VerifyRM.load(resolve_model(config.model, "reward"), config.optim, config.max_length, config.device,
                           config.dtype, trains=False)
        log.info("reward model %s loaded (version 0, no checkpoint in %s)", config.model, config.checkpoint_dir)
        return cls(rm, config, durable)

    @classmethod
    def _from_checkpoint(cls, rm: VerifyRM, config: RewardConfig, durable: Durability, path: Path) -> RewardCore:
        state = checkpoint.read_state(path, REWARD)
        if state.get("model") != config.model:
            log.warning("checkpoint %s was trained from %r, but reward.model is %r; resuming from the checkpoint",
                        path, state.get("model"), config.model)
        rm.version = state["version"]
        log.info("reward model %s from %s (version %d)", "loaded" if config.role == "replica" else "resumed", path,
                 rm.version)
        return cls(rm, config, durable, state, str(path))

    def _apply_journal(self) -> None:
        """Apply again, in order, the journaled updates after the loaded checkpoint, each with its recorded result.
        An update is a deterministic function of the weights, the AdamW state, the replay buffer, the version (which
        seeds the replay draws and the optimizer restarts) and the journaled pairs, so on one CPU kind the state
        comes back bit for bit."""

        def apply(entry: dict[str, Any]) -> UpdateResult:
            self._train([PreferencePair(*pair) for pair in entry["pairs"]], entry["optimizer_steps"])
            return UpdateResult(**entry["result"])

        applied = self.durable.replay(apply)
        if applied:
            log.info("reward applied %d journaled updates again (now version %d, update %d, last key %r)",
                     applied, self.rm.version, self.updates, self.last_key)

    def close(self) -> None:
        """Let a background checkpoint finish."""
        self.durable.wait()

    def _calibration_pass(self, size: int) -> None:
        """One forward pass of `size` CALIBRATION_TOKENS-token inputs (serving_defaults.with_batching)."""
        self.rm.logits([[self.rm.pad_id] * min(CALIBRATION_TOKENS, self.config.max_length)] * size, size)

    def batching(self) -> tuple[BatchingConfig, list[str], list[float] | None]:
        """The batching in use (the config's, with what it left unset chosen at load), why those were chosen, and
        the wait of a spread batch per size where the wait was chosen (None: max_wait_ms for every batch)."""
        return self.config.batching, self.batching_reasons, self.spread_waits_ms

    def use_batching(self, batching: BatchingConfig) -> None:
        """Batch as `batching` from now on: model copies take the first copy's choice, so all cut passes alike."""
        self.config = self.config.model_copy(update={"batching": batching})

    def linear_kernel(self) -> str:
        """How scoring passes run the linear layers (VerifyRM.use_linear_kernel): the config's, or chosen at load."""
        return self.rm.linear_kernel

    def use_linear_kernel(self, kernel: str) -> None:
        """Model copies take the first copy's kernel: copies compare their results after each update, which include
        scoring passes, so all must run the same one."""
        self.rm.use_linear_kernel(kernel)

    def score_tokens(self, token_lists: Sequence[Sequence[int]]) -> BatchScores:
        """Score one batch of encoded items (Encoder.encode), cut into forward passes by the batch size and the
        token budget."""
        self.durable.check_journaled()
        forward_s: list[float] = []
        batching = self.config.batching
        if batching.max_batch_size is None:  # load (with_batching) or use_batching chose it before any request
            raise RuntimeError("the reward core scores before its batch size was chosen")
        logits = self.rm.logits(token_lists, batching.max_batch_size, batching.max_tokens, forward_s.append)
        return BatchScores(logits, self.rm.version, forward_s)

    def score_texts(self, texts: Sequence[tuple[str, str, str]]) -> BatchScores:
        """Tokenize and score one batch of (question, reference, completion) items (reward.tokenize_in_model): one
        batched tokenizer call for the whole batch, in the model's process rather than the serving one's."""
        token_lists = self.rm.encoder.encode([ScoreItem(*text) for text in texts])
        return replace(self.score_tokens(token_lists), tokens=[len(tokens) for tokens in token_lists])

    def apply_update(self, key: str, pairs: Sequence[PreferencePair], optimizer_steps: int = 0) -> UpdateResult:
        """One Bradley-Terry update (`optimizer_steps` optimizer steps over the pairs and the replay; 0:
        reward.update_steps) -> version + 1, journaled before it returns; a key applied before returns its recorded
        result, trains nothing. A journal write that fails leaves the core refusing every call (UnjournaledUpdate)."""
        recorded = self.durable.recorded(key)
        if recorded is not None:
            return replace(recorded, replayed=True)
        steps = optimizer_steps or self.config.update_steps
        result = self._train(list(pairs), steps)
        self.durable.commit(key, result, {"key": key, "pairs": [astuple(pair) for pair in pairs],
                                          "optimizer_steps": steps, "result": asdict(result)})
        if self.durable.due():
            self.durable.save(self.rm.model, self.rm.tokenizer, self.rm.optimizer_state, self._state(""),
                              background=self.config.save_in_background)
        return result

    def _train(self, pairs: list[PreferencePair], steps: int) -> UpdateResult:
        replay = [pair for update in self._replay for pair in update]
        result = self.rm.update(pairs, replay, steps, self.config.calibration_weight, self.config.replay_sample,
                                self.config.optimizer_restart_every)
        if not result.skipped:
            self._replay.append(pairs)
        return result

    @property
    def updates(self) -> int:
        """Update calls applied, skipped ones included: the journal's sequence number."""
        return self.durable.sequence

    @property
    def last_key(self) -> str:
        return self.durable.last_key

    def _state(self, tag: str) -> dict[str, Any]:
        """The bookkeeping a checkpoint holds beside the weights and optimizer state."""
        return self.durable.state(tag, version=self.rm.version, model=self.config.model,
                                  replay=[[asdict(pair) for pair in update] for update in self._replay])

    def save(self, tag: str = "") -> SavedCheckpoint:
        """Write a checkpoint of the current state before returning."""
        path = self.durable.save(self.rm.model, self.rm.tokenizer, self.rm.optimizer_state, self._state(tag))
        return SavedCheckpoint(path, self.rm.version)

    def save_if_unsaved(self, tag: str) -> SavedCheckpoint | None:
        """Save when updates were applied since the last checkpoint (or since start-up without one)."""
        return self.durable.save_if_unsaved(lambda: self.save(tag))

    # ----- read replicas: follow the trainer's checkpoints -----

    def stage_checkpoint(self, path: str) -> None:
        """Start reading checkpoint `path` on the loader thread (returns at once); `staged()` says when it is read."""
        if self._staging is not None and not self._staging.done():
            raise RuntimeError(f"a checkpoint is already being staged; cannot stage {path} too")
        if self._loader is None:
            self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="verify-rm-load")
        self._staging = self._loader.submit(self._read_checkpoint, path)

    def staged(self) -> bool:
        """True once the staged checkpoint is read (or failed to read): swap_staged() will not wait."""
        return self._staging is None or self._staging.done()

    def swap_staged(self) -> ModelInfo:
        """Install the staged checkpoint: copy its tensors into the model's in place, take its version and key. A
        checkpoint that failed to read or check raises here, and the model stays as it was."""
        if self._staging is None:
            raise RuntimeError("no checkpoint is staged; call stage_checkpoint first")
        staging, self._staging = self._staging, None
        path, state, tensors = staging.result()
        own = self.rm.model.state_dict()
        with torch.no_grad():
            for name, tensor in tensors.items():
                own[name].copy_(tensor)
        self.rm.version = state["version"]
        self.durable.resume(path, state)  # a replica applies no updates: its key and count are what it reports
        log.info("replica: now serving %s (version %d)", path, self.rm.version)
        return self.info()

    def _read_checkpoint(self, path: str) -> tuple[str, dict[str, Any], dict[str, torch.Tensor]]:
        """The state and weights of a checkpoint, checked against the model: every tensor present with its shape
        (tied tensors may be saved once), nothing unknown; so that the swap cannot fail half-way."""
        state = checkpoint.read_state(path, REWARD)
        tensors = checkpoint.read_weights(path)
        own = self.rm.model.state_dict()
        unknown = sorted(set(tensors) - set(own))
        if unknown:
            raise ValueError(f"checkpoint {path} has tensors the model does not: {unknown[:3]}")
        for name, tensor in tensors.items():
            if tensor.shape != own[name].shape:
                raise ValueError(f"checkpoint {path}: {name} has shape {tuple(tensor.shape)}, the model "
                                 f"{tuple(own[name].shape)}")
        saved = {own[name].data_ptr() for name in tensors}
        missing = sorted(name for name in set(own) - set(tensors) if own[name].data_ptr() not in saved)
        if missing:
            raise ValueError(f"checkpoint {path} lacks tensors of the model: {missing[:3]}")
        return path, state, tensors

    def info(self) -> ModelInfo:
        tokenizer = self.rm.tokenizer
        return ModelInfo(self.config.model, self.rm.version, self.rm.parameters, str(self.rm.device), self.last_key,
                         self.durable.latest, tokenizer.pad_token, tokenizer.eos_token, self.tokenizer_source,
                         self.rm.model.config.id2label.get(0, "LABEL_0"))

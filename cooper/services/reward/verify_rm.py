"""VerifyRM: the reward model as plain functions over lists (no gRPC, no HTTP, no asyncio).

A sequence-classification model with one output scores a (question, reference, completion) text; the
Bradley-Terry loss trains it on (positive, negative) pairs and BCE pre-trains it on labelled triples
(docs/design.md section 2). Left out on purpose: LoRA, gradient checkpointing and multi-GPU sharding; the paper's
1.5B model trains on one GPU without them.

Padding: sequences are padded on the right with a full attention mask. A causal model's real tokens never attend
to the pads after them and keep positions 0..n-1, so a batched score equals the unbatched one up to float
rounding (tested to 1e-5). The model's own pooling picks the last non-pad token; user text is tokenized with
`split_special_tokens=True`, so a completion cannot smuggle in a pad token and move that pooling point.

Linear layers on a CPU (reward.cpu_linear): torch's x86 builds run a float32 linear layer through MKL, which on AMD
CPUs takes a code path without AVX-512; oneDNN, in the same build, does not. SmolLM2-135M's linear layers (85% of a
forward pass) ran at about 100 GFLOP/s a core through MKL and 210 through oneDNN on a Zen 5, 1.4-1.8x on the whole
pass (`bench/linear_kernel.py`); on the tiny models' 64-wide layers the two are within noise. So scoring passes may
run the linear layers through oneDNN (`use_linear_kernel`), chosen by timing both (`choose_linear_kernel`); training
passes (autograd on) always run torch's own, so the weights an update makes do not depend on the choice.
"""

from __future__ import annotations

import contextlib
import math
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from cooper.config import OptimConfig
from cooper.reward_rule import logit_to_reward
from cooper.runtime.devices import resolve_autocast, resolve_device, resolve_dtype
from cooper.services.reward.items import LabelledTriple, PreferencePair, ScoreItem, UpdateStats

LINEAR_KERNELS = ("torch", "onednn")
"""How a CPU float32 model's linear layers run in scoring passes: torch's own (MKL on x86) or oneDNN's."""
ONEDNN_MUST_WIN = 0.75
"""`choose_linear_kernel` takes oneDNN only when its passes take at most this share of torch's. Far from both
measured cases (0.55 for SmolLM2, 1.2-1.3 for the tiny models on a Zen 5), so that the timing never flips the choice
between two starts of one service: scores feed the policy's updates, and a run and its resume would otherwise
differ in their last bits."""

HEAD_CHARS = 500
TAIL_CHARS = 1000


def truncate_middle(text: str) -> str:
    """Over 1,500 characters: keep the first 500 and the last 1,000 (the final answer sits at the end)."""
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text
    return text[:HEAD_CHARS] + text[-TAIL_CHARS:]


def format_input(question: str, reference: str, completion: str) -> str:
    """The exact VerifyRM input of docs/design.md section 2.5: raw text, no chat template."""
    return (
        f"<question>{question}</question>\n"
        f"<reference_answer>{truncate_middle(reference)}</reference_answer>\n"
        f"<completion>{truncate_middle(completion)}</completion>"
    )


# The template as a pattern: what a client of a plain text classifier (vLLM's /classify) sends to score a triple.
# Non-greedy question and reference, so that only a completion may contain the closing tags of the parts before it;
# the closing </completion> is optional, since a policy's completion appended to a prompt that ends in
# "<completion>" has none.
INPUT_PATTERN = r"<question>([\s\S]*?)</question>\n<reference_answer>([\s\S]*?)</reference_answer>\n<completion>([\s\S]*?)(?:</completion>)?$"
_INPUT = re.compile(INPUT_PATTERN)


def parse_input(text: str, anywhere: bool = False) -> ScoreItem | None:
    """format_input's inverse: the (question, reference, completion) of a template text, None when it is not one.
    The text must start with the template, or, with `anywhere`, may have anything before it (chat markup)."""
    match = _INPUT.search(text) if anywhere else _INPUT.match(text)
    return ScoreItem(match[1], match[2], match[3]) if match else None


def bradley_terry_loss(positive_logits: torch.Tensor, negative_logits: torch.Tensor) -> torch.Tensor:
    """mean(-log sigmoid(s_pos - s_neg)) on raw logits; [n], [n] -> scalar."""
    return -F.logsigmoid(positive_logits.float() - negative_logits.float()).mean()


def calibration_loss(positive_logits: torch.Tensor, negative_logits: torch.Tensor) -> torch.Tensor:
    """The BCE of each pair's positive against label 1 and its negative against label 0, mean over all 2n texts."""
    return 0.5 * (F.softplus(-positive_logits.float()).mean() + F.softplus(negative_logits.float()).mean())


def pair_accuracy(positive_logits: Sequence[float], negative_logits: Sequence[float]) -> float:
    """Fraction of pairs with s_pos > s_neg (ties count as wrong)."""
    if not positive_logits:
        return 0.0
    return sum(p > n for p, n in zip(positive_logits, negative_logits, strict=True)) / len(positive_logits)


def _onednn_linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` through oneDNN when nothing needs autograd and x is float32 on a CPU, else torch's own."""
    if torch.is_grad_enabled() or x.dtype != torch.float32 or x.device.type != "cpu":
        return F.linear(x, layer.weight, layer.bias)
    # Weight and bias go as they are (oneDNN reads dense tensors): only the input and output are converted.
    return torch._C._nn.mkldnn_linear(x.to_mkldnn(), layer.weight, layer.bias).to_dense()


def plan_batches(lengths: Sequence[int], batch_size: int, max_tokens: int | None = None) -> list[list[int]]:
    """Row indices per forward pass: sorted by length, so that a pass pads little, and cut so that each pass holds
    at most batch_size rows and at most max_tokens padded tokens (a row longer than that runs alone)."""
    order = sorted(range(len(lengths)), key=lambda r: lengths[r])
    batches: list[list[int]] = []
    current: list[int] = []
    for row in order:  # ascending, so the row being added is the longest of its pass
        too_many = len(current) >= batch_size
        too_long = max_tokens is not None and (len(current) + 1) * lengths[row] > max_tokens
        if current and (too_many or too_long):
            batches.append(current)
            current = []
        current.append(row)
    if current:
        batches.append(current)
    return batches


class Encoder:
    """Items -> token ids of the VerifyRM template, at most max_length each. Thread-safe (one call at a time), and
    light: the serving process tokenizes requests with its own Encoder while the model works in another process."""

    def __init__(self, tokenizer: Any, max_length: int):
        self.tokenizer = tokenizer
        self.max_length = max_length
        self._lock = threading.Lock()  # fast tokenizers refuse concurrent use from two threads

    @classmethod
    def load(cls, source: str, max_length: int) -> Encoder:
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(source), max_length)

    def _encode(self, texts: list[str]) -> list[list[int]]:
        with self._lock:
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is not None and backend.truncation is None and backend.padding is None:
                # A fast tokenizer's own Rust call, as tokenizer(texts, split_special_tokens=True) makes it (same ids,
                # tested), without the ~50 us of Python that transformers adds per call: on the serving process's
                # event loop, that was a third of a single item's tokenizing. The "fast" batch call skips the
                # character offsets nothing here reads: 90 us per item instead of 110 (tiny VerifyRM, 120 tokens);
                # for a single text, called between other work as the event loop calls it, no slower in wall time
                # than encode (114 against 134 us).
                backend.encode_special_tokens = True
                return [encoding.ids for encoding in backend.encode_batch_fast(texts, add_special_tokens=True)]
            return self.tokenizer(texts, split_special_tokens=True)["input_ids"]

    def encode(self, items: Sequence[ScoreItem]) -> list[list[int]]:
        """Token ids of the template, at most max_length each (the completion loses its start first)."""
        ids = self._encode([format_input(i.question, i.reference, i.completion) for i in items])
        return [x if len(x) <= self.max_length else self._encode_long(item) for x, item in zip(ids, items, strict=True)]

    def _encode_long(self, item: ScoreItem) -> list[int]:
        # Rare path: tokenize the parts apart and cut the start of the completion, where nothing is decided.
        head = format_input(item.question, item.reference, "").removesuffix("</completion>")
        tail = truncate_middle(item.completion) + "</completion>"
        head_ids, tail_ids = self._encode([head, tail])
        room = self.max_length - len(head_ids)
        if room <= 0:
            return (head_ids + tail_ids)[-self.max_length :]
        return head_ids + tail_ids[-room:]


class VerifyRM:
    """The model, its tokenizer and its optimizer. Not thread-safe: the service runs it on one thread."""

    def __init__(self, model: Any, tokenizer: Any, optim: OptimConfig, max_length: int, source: str = "",
                 autocast_dtype: torch.dtype | None = None):
        """`autocast_dtype`: run forward passes under autocast in that dtype (bf16), the weights staying as loaded."""
        self.model = model.eval()  # eval also while training: dropout off, as usual for reward models
        self.autocast_dtype = autocast_dtype
        self.tokenizer = tokenizer
        self.encoder = Encoder(tokenizer, max_length)
        self.optim_config = optim
        self.source = source
        self.version = 0
        self.device = next(model.parameters()).device
        self.linear_kernel = "torch"  # use_linear_kernel
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad_id is None:
            raise ValueError(f"reward model {source!r}: the tokenizer has neither a pad nor an eos token; add one")
        self.pad_id = int(pad_id)
        # Batched inputs need the model to know the pad id to find each row's last real token.
        self.model.config.pad_token_id = self.pad_id
        # One forward per input, never generation: a decoder would otherwise build a KV cache on every pass.
        self.model.config.use_cache = False
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad], lr=optim.lr, betas=optim.betas, eps=optim.eps,
            weight_decay=optim.weight_decay,
        )
        warmup = optim.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
        )

    @classmethod
    def load(
        cls, source: str, optim: OptimConfig, max_length: int = 2048, device: str = "auto", dtype: str = "auto",
        trains: bool = True,
    ) -> VerifyRM:
        """Load a one-output sequence classifier by hub id or local directory.

        In bfloat16 (`dtype`, "auto" on a GPU) a model that `trains` keeps float32 weights and AdamW state and runs
        its forward passes under bf16 autocast, as the policy does: AdamW adding a 1e-5-sized step to a bf16 weight
        loses most of it (five steps at lr 1e-5 on N(0, 0.02) weights changed 15% of the elements). A model that
        only scores (a replica) holds bf16 weights: half the memory, the same forward."""
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        target = resolve_device(device, "reward.device")
        master = torch.float32 if trains else resolve_dtype(dtype, target)
        tokenizer = AutoTokenizer.from_pretrained(source)
        model = AutoModelForSequenceClassification.from_pretrained(source, dtype=master)
        if model.config.num_labels != 1:
            raise ValueError(
                f"reward model {source!r} has {model.config.num_labels} outputs; VerifyRM needs a "
                "sequence-classification model with num_labels=1"
            )
        autocast = resolve_autocast(dtype, target) if trains else None
        return cls(model.to(target), tokenizer, optim, max_length, source, autocast)

    # ----- how linear layers run (see the module docstring) -----

    def linear_kernel_applies(self) -> bool:
        """Whether the choice matters: a float32 model on a CPU, forward passes without autocast."""
        weight = next(self.model.parameters())
        return self.device.type == "cpu" and weight.dtype == torch.float32 and self.autocast_dtype is None

    def use_linear_kernel(self, kernel: str) -> None:
        """Run every linear layer's scoring passes with `kernel` (LINEAR_KERNELS) from now on. The layers stay the
        same modules with the same weights (checkpoints are untouched): "onednn" only overrides their forward."""
        if kernel not in LINEAR_KERNELS:
            raise ValueError(f"linear kernel {kernel!r}: choose one of {', '.join(LINEAR_KERNELS)}")
        onednn = kernel == "onednn" and self.linear_kernel_applies()
        for layer in self.model.modules():
            if isinstance(layer, torch.nn.Linear):
                if onednn:
                    layer.forward = _onednn_linear.__get__(layer)  # type: ignore[method-assign]
                else:
                    layer.__dict__.pop("forward", None)
        self.linear_kernel = "onednn" if onednn else "torch"

    def choose_linear_kernel(self, tokens: int, rows: int = 2, rounds: int = 3) -> tuple[str, str]:
        """Time scoring passes of `rows` inputs of `tokens` pad tokens with each kernel, alternating, `rounds` times;
        use the faster (oneDNN only when it takes at most ONEDNN_MUST_WIN of torch's time). (kernel, why). Two rows
        of 128 tokens take about 0.3 s a pass for a SmolLM2-sized model on a CPU and already show the difference."""
        token_lists = [[self.pad_id] * tokens] * rows
        if not self.linear_kernel_applies():
            self.use_linear_kernel("torch")
            return "torch", "not a float32 model on a CPU"
        seconds: dict[str, list[float]] = {kernel: [] for kernel in LINEAR_KERNELS}
        for _ in range(rounds + 1):  # the first round warms both up and is not counted
            for kernel in LINEAR_KERNELS:
                self.use_linear_kernel(kernel)
                start = time.perf_counter()
                self.logits(token_lists, len(token_lists))
                seconds[kernel].append(time.perf_counter() - start)
        torch_s, onednn_s = (sorted(seconds[k][1:])[rounds // 2] for k in LINEAR_KERNELS)
        kernel = "onednn" if onednn_s <= ONEDNN_MUST_WIN * torch_s else "torch"
        self.use_linear_kernel(kernel)
        return kernel, (f"a pass of {len(token_lists)} took {1000 * onednn_s:.1f} ms with oneDNN's linear layers, "
                        f"{1000 * torch_s:.1f} ms with torch's")

    @property
    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    # ----- tokens -----

    def encode(self, items: Sequence[ScoreItem]) -> list[list[int]]:
        """Token ids of the template, at most max_length each (see Encoder)."""
        return self.encoder.encode(items)

    def _batch(self, token_lists: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        longest = max(len(x) for x in token_lists)
        input_ids = torch.full((len(token_lists), longest), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros((len(token_lists), longest), dtype=torch.long)
        for row, ids in enumerate(token_lists):  # right padding, see the module docstring
            input_ids[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids.to(self.device), "attention_mask": attention_mask.to(self.device)}

    def forward(self, token_lists: Sequence[Sequence[int]]) -> torch.Tensor:
        """Raw logits [n] (float32), with autograd if enabled by the caller."""
        autocast = (torch.autocast(self.device.type, dtype=self.autocast_dtype) if self.autocast_dtype is not None
                    else contextlib.nullcontext())
        with autocast:
            return self.model(**self._batch(token_lists)).logits[:, 0].float()

    # ----- scoring -----

    def logits(self, token_lists: Sequence[Sequence[int]], batch_size: int = 64, max_tokens: int | None = None,
               on_forward: Callable[[float], None] | None = None) -> list[float]:
        """Logits of already encoded inputs, in order; forward passes of similar lengths, each within batch_size
        sequences and max_tokens padded tokens. `on_forward(seconds)` is called after each pass."""
        out = [0.0] * len(token_lists)
        with torch.inference_mode():
            for rows in plan_batches([len(x) for x in token_lists], batch_size, max_tokens):
                start = time.perf_counter()
                values = self.forward([token_lists[r] for r in rows]).tolist()
                if on_forward is not None:
                    on_forward(time.perf_counter() - start)
                for row, value in zip(rows, values, strict=True):
                    out[row] = value
        return out

    def score(self, items: Sequence[ScoreItem], batch_size: int = 64) -> list[tuple[float, float]]:
        """(sigmoid(logit), logit) per item, in order."""
        return [(logit_to_reward(x), x) for x in self.logits(self.encode(items), batch_size)]

    # ----- training -----

    def update(self, pairs: Sequence[PreferencePair], replay: Sequence[PreferencePair] = (),
               optimizer_steps: int = 1, calibration_weight: float = 0.0, replay_sample: int = 0,
               restart_every: int = 0) -> UpdateStats:
        """`optimizer_steps` AdamW steps on the Bradley-Terry loss over `pairs` plus `replay` (earlier updates'
        pairs), each over all of them (micro-batches, accumulated gradients); the version rises by one. With
        `calibration_weight` w > 0 the loss is BT + w * calibration_loss (reward.calibration_weight). With
        `replay_sample` k > 0 each step takes all fresh pairs and k replayed ones drawn without replacement
        (reward.replay_sample), from a generator seeded by the version, so a restarted service draws the same.
        With `restart_every` n > 0, AdamW's state is reset before every n-th update (reward.optimizer_restart_every),
        counted by the version, so a restarted service resets at the same updates.

        Loss and pair accuracy (before and after) are those of the fresh `pairs`: what this step's data taught.
        Skipped, with the version kept, when there are no fresh pairs or a gradient norm is not finite (steps
        already taken stay taken).
        """
        if not pairs:
            return UpdateStats(0.0, 0.0, 0.0, 0.0, self.version, skipped=True)
        if restart_every and self.version % restart_every == 0:
            self.optimizer.state.clear()  # fresh moments: AdamW's first steps after it are full-size again
        everything = list(pairs) + list(replay)
        fresh = len(pairs)
        draw = random.Random(self.version)
        plans = [self._step_rows(fresh, len(everything), replay_sample, draw) for _ in range(optimizer_steps)]
        # Only the pairs some step trains on are tokenized (a sampled replay leaves most of it out this update).
        used = sorted(set().union(*plans))
        used_pairs = [everything[r] for r in used]
        ids = self.encode([ScoreItem(p.question, p.reference, p.positive) for p in used_pairs]
                          + [ScoreItem(p.question, p.reference, p.negative) for p in used_pairs])
        pos = dict(zip(used, ids[: len(used)], strict=True))
        neg = dict(zip(used, ids[len(used) :], strict=True))
        per_micro = max(1, self.optim_config.micro_batch_size // 2)  # a pair is two sequences
        loss = before = grad_norm = 0.0
        for step, rows in enumerate(plans):
            self.optimizer.zero_grad(set_to_none=True)
            margins: list[float] = []
            for start in range(0, len(rows), per_micro):
                micro = rows[start : start + per_micro]
                positive_logits, negative_logits = self._pair_logits([pos[r] for r in micro], [neg[r] for r in micro])
                micro_loss = bradley_terry_loss(positive_logits, negative_logits)
                if calibration_weight:
                    micro_loss = micro_loss + calibration_weight * calibration_loss(positive_logits, negative_logits)
                # Weighted by its share of the step's pairs, so the accumulated gradient is that of their mean.
                (micro_loss * (len(micro) / len(rows))).backward()
                margins += (positive_logits - negative_logits).tolist()
            if step == 0:
                fresh_margins = torch.tensor(margins[:fresh])
                loss = float(torch.nn.functional.softplus(-fresh_margins).mean())
                before = pair_accuracy(margins[:fresh], [0.0] * fresh)
            step_norm = self._clip_and_step()
            if step_norm is None or not math.isfinite(loss):
                return UpdateStats(loss, float("nan") if step_norm is None else step_norm, before, before,
                                   self.version, skipped=True)
            if step == 0:
                grad_norm = step_norm
        self.version += 1
        after_logits = self.logits([pos[r] for r in range(fresh)] + [neg[r] for r in range(fresh)])
        after = pair_accuracy(after_logits[:fresh], after_logits[fresh:])
        return UpdateStats(loss, grad_norm, before, after, self.version, skipped=False)

    @staticmethod
    def _step_rows(fresh: int, total: int, replay_sample: int, draw: random.Random) -> list[int]:
        """Rows of `pairs + replay` one optimizer step trains on: every fresh pair, and `replay_sample` replayed
        ones drawn without replacement (all of them when replay_sample is 0 or the replay is no larger)."""
        if replay_sample and total - fresh > replay_sample:
            return list(range(fresh)) + sorted(draw.sample(range(fresh, total), replay_sample))
        return list(range(total))

    def _pair_logits(self, positives: list[list[int]], negatives: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits (with autograd) of a micro-batch's positives and negatives, each distinct text forwarded once: the
        pairs of a group share its positive, so about a third of the texts of a micro-batch are repeats."""
        distinct: dict[tuple[int, ...], int] = {}
        index = [distinct.setdefault(tuple(ids), len(distinct)) for ids in positives + negatives]
        logits = self.forward(list(distinct))[torch.tensor(index, device=self.device)]
        return logits[: len(positives)], logits[len(positives) :]

    def _clip_and_step(self) -> float | None:
        """Clip and step; None (and no step) when the total gradient norm is not finite."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.optim_config.grad_clip))
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return None
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def pretrain(
        self, triples: Sequence[LabelledTriple], epochs: int = 3, lr: float = 2e-5, batch_size: int = 16,
        seed: int = 0, on_step: Callable[[int, float], None] | None = None,
    ) -> dict[str, float]:
        """BCE on labelled triples with its own AdamW (paper: lr 2e-5, 3 epochs); the version is unchanged.

        `on_step(triples, loss)` is called after each optimizer step with the batch's size and loss (a progress bar's
        hook). Returns the mean loss of the last epoch and the accuracy (sigmoid > 0.5 matches the label) after
        training.
        """
        if not triples:
            raise ValueError("pretrain needs at least one labelled triple")
        ids = self.encode([ScoreItem(t.question, t.reference, t.completion) for t in triples])
        labels = torch.tensor([float(t.label) for t in triples], device=self.device)
        optimizer = torch.optim.AdamW(self.model.parameters(), lr=lr, weight_decay=self.optim_config.weight_decay)
        order = list(range(len(triples)))
        rng = random.Random(seed)
        last_loss = 0.0
        for _ in range(epochs):
            rng.shuffle(order)
            epoch_loss = 0.0
            for start in range(0, len(order), batch_size):
                rows = order[start : start + batch_size]
                logits = self.forward([ids[r] for r in rows])
                loss = F.binary_cross_entropy_with_logits(logits, labels[rows])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.optim_config.grad_clip)
                optimizer.step()
                epoch_loss += loss.item() * len(rows)
                if on_step is not None:
                    on_step(len(rows), loss.item())
            last_loss = epoch_loss / len(order)
        final = self.logits(ids)
        accuracy = sum((x > 0) == t.label for x, t in zip(final, triples, strict=True)) / len(triples)
        return {"loss": last_loss, "accuracy": accuracy}

    # ----- state -----

    def optimizer_state(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])

"""Tiny tokenizer and Qwen2-architecture models: shipped with the package, or built on the spot and cached on disk.

They are saved with `save_pretrained` and loaded back with the same `from_pretrained` code that loads hub models,
so the real loading path is what tests exercise. cooper/tiny/__init__.py registers their names with
cooper.runtime.models.

The models the presets and tests use are shipped built (cooper/tiny/shipped/<TINY_VERSION>/, about 5 MB, written by
`python -m cooper.tiny.ship`), because float kernels differ between CPU kinds: the same builder run on two machines
gives two different SFT policies and VerifyRMs, and a training result follows its starting models (docs/experiments.md).
Shipped, every machine starts from the same weights. A name the shipped set lacks (`small`), or any name inside
`building_locally()`, is built here instead, through cooper.runtime.models.build_once (a temp directory renamed into
place, so several processes may ask for it at once) into the cache.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

from cooper.runtime.models import build_once, cache_root
from cooper.tiny.task import make_split, wrong_solution

TINY_VERSION = "v9"  # bump when a builder or the prompt changes, so caches are not reused (v9: RM pretrained until
# it has learned the reference check)
SHIPPED = Path(__file__).parent / "shipped" / TINY_VERSION
"""The built models that ship with the package, one directory per name, and manifest.json saying how they were built
and what they measure; `python -m cooper.tiny.ship` writes it."""
_build_here = False
VOCAB_SIZE = 512
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


class ShippedModelDamaged(RuntimeError):
    """A shipped model's files are not those its manifest names; the message names the file."""


@functools.cache  # read once per process: every name a service resolves asks
def _shipped_manifest() -> dict[str, dict[str, str]]:
    """name -> {file name: SHA-256} of the built models shipped with this TINY_VERSION ({} without a shipped set)."""
    manifest = SHIPPED / "manifest.json"
    return json.loads(manifest.read_text())["models"] if manifest.is_file() else {}


def shipped_names() -> list[str]:
    """The names of the built models shipped with this TINY_VERSION (none when the package has no shipped set)."""
    return sorted(_shipped_manifest())


@functools.cache  # once per name and process: 4 MB of files in all, read in milliseconds
def verified_shipped(name: str) -> Path:
    """The shipped model's directory, once every file in it is the one manifest.json names (SHA-256): a damaged or
    edited install is an error naming the file, not a model that quietly loads other weights."""
    directory, expected = SHIPPED / name, _shipped_manifest()[name]
    present = {p.name for p in directory.iterdir() if p.is_file()} if directory.is_dir() else set()
    for file in sorted(expected.keys() | present):
        path = directory / file
        if file not in present:
            problem = "is missing"
        elif file not in expected:
            problem = "is not in the manifest"
        elif hashlib.sha256(path.read_bytes()).hexdigest() != expected[file]:
            problem = "differs from the SHA-256 manifest.json gives it"
        else:
            continue
        raise ShippedModelDamaged(f"{path} {problem}: the installed package is damaged or was edited; reinstall "
                                  f"Cooper (pip install --force-reinstall --no-deps <the package>)")
    return directory


@contextlib.contextmanager
def building_locally() -> Iterator[None]:
    """Inside it, every tiny model is built on this machine (into the cache) instead of taken from the shipped set:
    how `python -m cooper.tiny.ship` makes the set, and how the tests check that a rebuild still measures up."""
    global _build_here
    before, _build_here = _build_here, True
    try:
        yield
    finally:
        _build_here = before


def build_tiny(name: str, build: Callable[[Path], None]) -> Path:
    """The tiny preset's model `name`: the shipped one, else built once into the cache of this TINY_VERSION."""
    if not _build_here and name in shipped_names():
        return verified_shipped(name)
    return build_once(cache_root() / "tiny" / TINY_VERSION / name, build)


def _corpus() -> list[str]:
    rng = random.Random(0)
    lines = ["user", "assistant", "system", "Please reason step by step, and put your final answer within \\boxed{}."]
    for p in make_split(2000, 0, "corpus"):
        lines += [p.question, p.solution, wrong_solution(p, rng)]
    lines += [f"<question>{p.question}</question>\n<reference_answer>{p.answer}</reference_answer>" for p in
              make_split(200, 1, "corpus")]
    return lines


def tiny_tokenizer_dir() -> Path:
    """A byte-level BPE tokenizer (512 tokens) with a ChatML template, trained on the tiny task's text."""

    def build(out: Path) -> None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE, special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
        )
        tok.train_from_iterator(_corpus(), trainer=trainer)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None,
            unk_token=None, additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
        )
        fast.chat_template = CHAT_TEMPLATE
        fast.padding_side = "left"
        fast.save_pretrained(out)

    return build_tiny("tokenizer", build)


# name -> (hidden, intermediate, layers, heads, kv heads). "small" (~4M parameters) is for benchmarks where the
# tiny model's forward pass would be all Python overhead and no compute, unlike any real model's. "tiny-hd32" is the
# tiny model with 2 heads of 32 instead of 4 of 16: vLLM's CPU attention refuses head_dim 16.
SIZES = {"tiny": (64, 128, 2, 4, 2), "small": (256, 1024, 4, 8, 4), "tiny-hd32": (64, 128, 2, 2, 1)}


def _qwen2_config(vocab_size: int, pad_id: int, eos_id: int, size: str = "tiny"):  # type: ignore[no-untyped-def]
    from transformers import Qwen2Config

    hidden, intermediate, layers, heads, kv_heads = SIZES[size]
    return Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=2048,
        tie_word_embeddings=True, pad_token_id=pad_id, eos_token_id=eos_id, bos_token_id=None,
        num_labels=1, use_cache=True,
    )


def _build_model(kind: str, out: Path, size: str = "tiny") -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir())
    config = _qwen2_config(len(tokenizer), tokenizer.pad_token_id, tokenizer.eos_token_id, size)
    torch.manual_seed(0 if kind == "causal" else 1)
    model = Qwen2ForCausalLM(config) if kind == "causal" else Qwen2ForSequenceClassification(config)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def tiny_causal_lm_dir() -> Path:
    """A randomly initialised 2-layer Qwen2 causal LM (about 0.1M parameters) with its tokenizer."""
    return build_tiny("causal-lm", lambda out: _build_model("causal", out))


def tiny_reward_model_dir() -> Path:
    """A randomly initialised 2-layer Qwen2 sequence classifier with one output, with its tokenizer."""
    return build_tiny("reward-model", lambda out: _build_model("reward", out))


def small_model_dir(kind: str) -> Path:
    """A randomly initialised 4-layer, 256-wide Qwen2 of `kind` ("causal" or "reward"), with the tiny tokenizer."""
    return build_tiny(f"small-{kind}", lambda out: _build_model(kind, out, "small"))


def tiny_hd32_model_dir(kind: str) -> Path:
    """A randomly initialised 2-layer Qwen2 of `kind` like "tiny" but with head_dim 32 (what vLLM's CPU build runs)."""
    return build_tiny(f"tiny-hd32-{kind}", lambda out: _build_model(kind, out, "tiny-hd32"))


def tiny_model_dir(kind: str) -> Path:
    """The random tiny model of `kind`: "causal" (tiny_causal_lm_dir) or "reward" (tiny_reward_model_dir)."""
    if kind == "causal":
        return tiny_causal_lm_dir()
    if kind == "reward":
        return tiny_reward_model_dir()
    raise ValueError(f"unknown tiny model kind {kind!r}; expected 'causal' or 'reward'")

"""Write the shipped set of built tiny models: `python -m cooper.tiny.ship [--cache DIR] [--out DIR]`.

Builds every model the presets and tests load by name (tokenizer, the random tiny models, the SFT policy, the three
VerifyRMs, and their head_dim-32 twins for vLLM) on this machine, copies them to cooper/tiny/shipped/<TINY_VERSION>/
and writes its manifest.json: how they were built (date, CPU, torch, transformers), a SHA-256 of every file, and
what they measure (quality.py) on held-out problems, which a rebuild must meet (tests/test_tiny_models.py). Run it
after bumping TINY_VERSION, and commit the result: every machine then starts from these weights. About 10 minutes
on 2 CPU cores (the SFTs and the VerifyRMs' pretraining), or seconds with `--cache` pointing at a cache that already
holds this version's builds made without a shipped set.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cooper.tiny import models, warm_start

SHIPPED_BUILDS: dict[str, Callable[[], Path]] = {
    "tokenizer": models.tiny_tokenizer_dir,
    "causal-lm": models.tiny_causal_lm_dir,
    "reward-model": models.tiny_reward_model_dir,
    "policy-sft": warm_start.tiny_sft_policy_dir,
    "reward-pretrained": warm_start.tiny_pretrained_rm_dir,
    "reward-pretrained-noisy": warm_start.tiny_noisy_rm_dir,
    "reward-pretrained-keyed": warm_start.tiny_keyed_rm_dir,
    "tiny-hd32-causal": lambda: models.tiny_hd32_model_dir("causal"),
    "tiny-hd32-reward": lambda: models.tiny_hd32_model_dir("reward"),
    "policy-sft-hd32": warm_start.tiny_sft_hd32_policy_dir,
}
"""Directory name in the shipped set -> the builder that makes it. `small` (16 MB a model, random, for benchmarks
only) is built where it is used. Every file is checked against manifest.json's SHA-256 when a process first
resolves its model (models.verified_shipped). The rebuild test (tests/test_tiny_models.py, run by hand with
COOPER_REBUILD_TINY=1: minutes of training) rebuilds policy-sft and two of the VerifyRMs and checks their quality; reward-pretrained-noisy and policy-sft-hd32 are derived, the same
builders with one input changed (flipped labels; the head_dim-32 base), and are checked by their hashes only."""

QUALITY_PROMPTS, QUALITY_K = 128, 4
"""Held-out problems and samples of each that quality() measures the SFT policy and the VerifyRMs on."""


def quality(policy: Path, reward_models: dict[str, Path]) -> dict[str, Any]:
    """The SFT policy's sampled accuracy on held-out problems, and each VerifyRM's ranking of those samples."""
    from cooper.tiny import quality as measure
    from cooper.tiny.task import HELD_OUT_SPLIT

    samples = measure.policy_samples(policy, QUALITY_PROMPTS, QUALITY_K, split=HELD_OUT_SPLIT)
    return {"samples": f"{QUALITY_PROMPTS} {HELD_OUT_SPLIT} problems x {QUALITY_K} at T = 1",
            "policy-sft": measure.policy_quality(samples),
            **{name: measure.reward_model_quality(path, samples) for name, path in reward_models.items()}}


def cpu_name() -> str:
    """The CPU's model name and widest vector extension (float results differ between AVX2 and AVX-512)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line for line in info.splitlines() if line.startswith("flags")), "")
    return f"{name} ({'AVX-512' if 'avx512f' in flags else 'AVX2' if 'avx2' in flags else 'no AVX2'})"


def file_hashes(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir()) if p.is_file()}


def ship(out: Path, cache: Path) -> dict[str, Any]:
    """Build every SHIPPED_BUILDS model into `cache` (reusing complete builds there), copy them to `out`, and write
    out/manifest.json; returns the manifest."""
    import torch
    import transformers

    os.environ["COOPER_CACHE"] = str(cache)
    with models.building_locally():
        built = {name: build() for name, build in SHIPPED_BUILDS.items()}
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    for name, path in built.items():
        shutil.copytree(path, out / name, ignore=shutil.ignore_patterns(".complete"))
    reward_models = {name: out / name for name in ("reward-pretrained", "reward-pretrained-keyed",
                                                    "reward-pretrained-noisy")}
    manifest = {
        "version": models.TINY_VERSION,
        "built": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d"),
        "cpu": cpu_name(), "torch": torch.__version__, "transformers": transformers.__version__,
        "command": "python -m cooper.tiny.ship",
        "models": {name: file_hashes(out / name) for name in built},
        "quality": quality(out / "policy-sft", reward_models),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=models.SHIPPED, help="where the set goes (default: %(default)s)")
    parser.add_argument("--cache", type=Path, help="build cache to use (default: a new empty one, so that every "
                        "model is built here from scratch)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="cooper-ship-") as fresh:
        manifest = ship(args.out, args.cache or Path(fresh))
    print(json.dumps(manifest["quality"], indent=1))


if __name__ == "__main__":
    main()

"""The `tiny` preset: a synthetic arithmetic task and tiny Qwen2-architecture models built locally (no hub).

Importing it registers the preset's model names with cooper.runtime.models, which `import cooper` does, so that
every service resolves them without importing this package:

- "tiny": a random 2-layer model of the kind asked for (causal LM or one-output classifier);
- "small": a random 4-layer, 256-wide one; "tiny-hd32": a random tiny one with head_dim 32 (vLLM's CPU build);
- "tiny-sft", "tiny-sft-hd32": the warm-started policy (of "tiny", of "tiny-hd32"); "tiny-rm": the pretrained
  VerifyRM (warm_start.py); "tiny-rm-noisy": the same, pretrained on labels of which a quarter are flipped;
  "tiny-rm-keyed": the same with an answer key (bare right answers) among its positives.

The modules: `task.py` (the task), `examples.py` (fixed worked solutions), `models.py` (tokenizer and models,
shipped or built), `warm_start.py` (the SFT policy and the VerifyRMs), `quality.py` (what they measure), `ship.py`
(writing the shipped set).
"""

import importlib
from pathlib import Path

from cooper.runtime.models import ModelBuilder, register_models


def _builder(function: str, of_kind: bool = True) -> ModelBuilder:
    """`function` ("module:name" under cooper.tiny), imported when a name is first resolved: every Cooper process
    imports this package (`import cooper`), and only those that build or load a tiny model need its builders (the
    task's tables, the warm starts)."""
    module, name = function.split(":")

    def build(kind: str) -> Path:
        make = getattr(importlib.import_module(f"cooper.tiny.{module}"), name)
        return make(kind) if of_kind else make()

    return build


register_models({
    "tiny": _builder("models:tiny_model_dir"),
    "tiny-sft": _builder("warm_start:tiny_sft_policy_dir", of_kind=False),
    "tiny-rm": _builder("warm_start:tiny_pretrained_rm_dir", of_kind=False),
    "tiny-rm-noisy": _builder("warm_start:tiny_noisy_rm_dir", of_kind=False),
    "tiny-rm-keyed": _builder("warm_start:tiny_keyed_rm_dir", of_kind=False),
    "small": _builder("models:small_model_dir"),
    "tiny-hd32": _builder("models:tiny_hd32_model_dir"),
    "tiny-sft-hd32": _builder("warm_start:tiny_sft_hd32_policy_dir", of_kind=False),
})

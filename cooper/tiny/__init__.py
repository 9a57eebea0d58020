"""The `tiny` preset: a synthetic arithmetic task and tiny Qwen2-architecture models built locally (no hub).

Importing it registers the preset's model names with cooper.runtime.models, which `import cooper` does, so that
every service resolves them without importing this package:

- "tiny": a random 2-layer model of the kind asked for (causal LM or one-output classifier);
- "small": a random 4-layer, 256-wide one; "tiny-hd32": a random tiny one with head_dim 32 (vLLM's CPU build);
- "tiny-sft", "tiny-sft-hd32": the warm-started policy (of "tiny", of "tiny-hd32"); "tiny-rm": the pretrained
  VerifyRM (warm_start.py); "tiny-rm-noisy": the same, pretrained on labels of which a quarter are flipped;
  "tiny-rm-keyed": the same with an answer key (bare right answers) among its positives.
"""

from cooper.runtime.models import register_models
from cooper.tiny.models import small_model_dir, tiny_hd32_model_dir, tiny_model_dir
from cooper.tiny.warm_start import (
    tiny_keyed_rm_dir,
    tiny_noisy_rm_dir,
    tiny_pretrained_rm_dir,
    tiny_sft_hd32_policy_dir,
    tiny_sft_policy_dir,
)

register_models({
    "tiny": tiny_model_dir,
    "tiny-sft": lambda kind: tiny_sft_policy_dir(),
    "tiny-rm": lambda kind: tiny_pretrained_rm_dir(),
    "tiny-rm-noisy": lambda kind: tiny_noisy_rm_dir(),
    "tiny-rm-keyed": lambda kind: tiny_keyed_rm_dir(),
    "small": small_model_dir,
    "tiny-hd32": tiny_hd32_model_dir,
    "tiny-sft-hd32": lambda kind: tiny_sft_hd32_policy_dir(),
})

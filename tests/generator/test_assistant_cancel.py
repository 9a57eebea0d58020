"""An assistant call whose caller goes away must not let the next call into the model beside it."""

from __future__ import annotations

import asyncio
import threading
import time

from cooper.services.generator.assistant import ChatRequest, TransformersAssistant, VLLMAssistant


def _engine_that_counts(assistant_cls: type) -> tuple[object, dict[str, int]]:
    """An assistant of `assistant_cls` whose model is a 0.3 s sleep that records how many calls are inside it at once
    (the real model is not needed to see the lock; the class's own chat() and lock are what run)."""
    assistant = object.__new__(assistant_cls)
    assistant._lock = threading.Lock()
    assistant.batch_size = 8
    seen = {"inside": 0, "most": 0}

    def generate(requests: list[ChatRequest]) -> list[str]:
        seen["inside"] += 1
        seen["most"] = max(seen["most"], seen["inside"])
        time.sleep(0.3)
        seen["inside"] -= 1
        return ["reply"] * len(requests)

    assistant._generate = generate
    return assistant, seen


def _cancel_one_then_call_again(assistant: object) -> list[str]:
    request = ChatRequest([{"role": "user", "content": "hi"}], temperature=0.0, max_tokens=4)

    async def main() -> list[str]:
        gone = asyncio.ensure_future(assistant.chat([request]))
        await asyncio.sleep(0.1)  # inside the model
        gone.cancel()
        return await assistant.chat([request])

    return asyncio.run(main())


def test_transformers_assistant_runs_one_call_at_a_time_through_a_cancel():
    assistant, seen = _engine_that_counts(TransformersAssistant)
    assert _cancel_one_then_call_again(assistant) == ["reply"]
    assert seen["most"] == 1


def test_vllm_assistant_runs_one_call_at_a_time_through_a_cancel():
    assistant, seen = _engine_that_counts(VLLMAssistant)
    assert _cancel_one_then_call_again(assistant) == ["reply"]
    assert seen["most"] == 1

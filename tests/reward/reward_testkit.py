"""Shared by the reward tests: a small config, preference pairs and items of varied length from the tiny task."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cooper.config import BatchingConfig, HttpConfig, OptimConfig, RewardConfig, RewardServerConfig
from cooper.services.reward.service import RewardService
from cooper.services.reward.serving.http import HttpServer, create_app, start_http
from cooper.services.reward.verify_rm import PreferencePair, ScoreItem
from cooper.tiny.task import make_split, wrong_solution

ROOT = Path(__file__).resolve().parents[2]


def start_reward_processes(tmp_path: Path, overrides: dict[str, Sequence[str]],
                           timeout_s: float = 120) -> dict[str, tuple[subprocess.Popen[bytes], dict[str, Any]]]:
    """`cooper serve reward` per name, with free ports, on the CPU, plus that name's dotted overrides; all started
    at once, then waited for: name -> (process, its ready file). Stop them with stop_processes."""
    started = {}
    for name, extra in overrides.items():
        ready = tmp_path / f"{name}.ready.json"
        command = [sys.executable, "-m", "cooper.cli", "serve", "reward", "--port", "0", "--ready-file", str(ready),
                   "reward.http.port=0", "reward.server.metrics_port=null", "reward.device=cpu",
                   "reward.torch_threads=1", *extra]
        started[name] = (subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT))), ready)
    out = {}
    deadline = time.monotonic() + timeout_s
    try:
        for name, (process, ready) in started.items():
            while not ready.exists():
                assert process.poll() is None, f"cooper serve reward ({name}) exited with {process.returncode}"
                assert time.monotonic() < deadline, f"cooper serve reward ({name}) did not become ready"
                time.sleep(0.05)
            out[name] = (process, json.loads(ready.read_text()))
    except BaseException:
        stop_processes([p for p, _ in started.values()])
        raise
    return out


def stop_processes(processes: Sequence[subprocess.Popen[bytes]]) -> list[int]:
    """SIGTERM all, then wait for each (killing one that outlives 60 s); their exit codes."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=60))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
    return codes


def tiny_pairs(n: int, seed: int = 0) -> list[PreferencePair]:
    rng = random.Random(seed)
    return [PreferencePair(p.question, p.answer, p.solution, wrong_solution(p, rng))
            for p in make_split(n, seed, "reward-test")]


def tiny_items(n: int, seed: int = 0) -> list[ScoreItem]:
    """Items of varied length (filler before the solution), so that batches need padding."""
    rng = random.Random(seed)
    items = []
    for i, p in enumerate(make_split(n, seed, "reward-items")):
        completion = p.solution if i % 2 else wrong_solution(p, rng)
        items.append(ScoreItem(p.question, p.answer, "Let me see. " * rng.randint(0, 8) + completion))
    return items


def make_config(tmp_path: Path, **overrides) -> RewardConfig:  # type: ignore[no-untyped-def]
    """A reward config for tests: free ports, checkpoints under tmp_path, a learning rate a tiny model notices."""
    base = {
        "server": RewardServerConfig(port=0, metrics_port=None),
        "http": HttpConfig(port=0),
        "checkpoint_dir": str(tmp_path / "checkpoints"),
        "optim": OptimConfig(lr=3e-3, micro_batch_size=8),
        # Set, not calibrated: two services that chose different batches would cut the same request into different
        # forward passes, and the tests compare scores across services bit for bit.
        "batching": BatchingConfig(max_batch_size=64, max_wait_ms=2),
        "cpu_linear": "torch",  # set, not timed at start-up, for the same reason
        "device": "cpu",
        "model_process": False,  # the model on a thread, so that tests can look inside it (test_model_process.py)
    }
    base.update(overrides)
    return RewardConfig(**base)


@dataclass
class Served:
    loop: asyncio.AbstractEventLoop
    service: RewardService
    http: HttpServer
    url: str

    def run(self, coro: Any, timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


@contextlib.contextmanager
def serve_http(config: RewardConfig) -> Iterator[Served]:
    """The service and its HTTP API on a real uvicorn on loopback, in an event loop on a background thread, as in
    `cooper serve reward`; the loop handle lets a test hold the model thread, to fill the queue deterministically."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> tuple[RewardService, HttpServer]:
        service = await RewardService.create(config)
        return service, await start_http(create_app(config, service), "127.0.0.1", 0)

    service, http = asyncio.run_coroutine_threadsafe(start(), loop).result(120)
    try:
        yield Served(loop, service, http, f"http://127.0.0.1:{http.port}")
    finally:
        async def stop() -> None:
            await http.stop()
            await service.stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(60)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

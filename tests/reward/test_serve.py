"""`cooper serve reward` as a real process: gRPC and HTTP in one process, SIGTERM drains and saves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from killed_caller import kill_mid_call
from reward_testkit import make_config, tiny_items, tiny_pairs

from cooper.services.reward.client import RewardClient
from cooper.services.reward.core import RewardCore

ROOT = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, name: str) -> tuple[subprocess.Popen[bytes], dict]:
    ready = tmp_path / f"{name}.json"
    command = [
        sys.executable, "-m", "cooper.cli", "serve", "reward", "--port", "0", "--ready-file", str(ready),
        "reward.http.port=0", "reward.server.metrics_port=null", f"reward.checkpoint_dir={tmp_path / 'ckpt'}",
        "reward.optim.lr=0.003", "reward.device=cpu",
    ]
    process = subprocess.Popen(command, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    deadline = time.monotonic() + 120
    while not ready.exists():
        assert process.poll() is None, f"cooper serve reward exited with {process.returncode}"
        assert time.monotonic() < deadline, "cooper serve reward did not become ready"
        time.sleep(0.1)
    return process, json.loads(ready.read_text())


def stop(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=60)


def test_serve_reward_grpc_and_http_then_sigterm_saves(tmp_path: Path) -> None:
    items = tiny_items(4)
    process, ready = serve(tmp_path, "first")
    try:
        # The start-up heap (torch, transformers, the apps: ~200k objects) is frozen out of the collector's reach, so
        # a full collection while serving does not stall every request (cooper/runtime/server.py).
        assert ready["gc_frozen_objects"] > 100_000
        with RewardClient(f"127.0.0.1:{ready['grpc_port']}") as client:
            client.wait_ready(30)
            assert client.score(items).version == 0
            update = client.update("run", 7, tiny_pairs(2))
            assert update.version == 1 and not update.replayed and not update.skipped
            assert client.update("run", 7, tiny_pairs(2)).replayed
            scored = client.score(items)
            assert scored.version == 1 and len(scored.scores) == 4
            info = client.info()
            assert (info.version, info.last_key, info.checkpoint) == (1, "run/7", "")
        reply = httpx.post(f"http://127.0.0.1:{ready['http_port']}/v1/score", json={"items": [
            {"question": i.question, "reference": i.reference, "completion": i.completion} for i in items]})
        assert reply.json()["version"] == 1  # same model behind both APIs
        assert max(abs(s["logit"] - x) for s, x in zip(reply.json()["scores"], scored.logits, strict=True)) <= 1e-5
    finally:
        assert stop(process) == 0  # graceful: drains, then saves the unsaved update (save_on_stop)

    # The restarted service loads what SIGTERM saved (a second process start is covered in-process, faster, by
    # test_service's restart test).
    restarted = RewardCore.load(make_config(tmp_path, checkpoint_dir=str(tmp_path / "ckpt")))
    assert restarted.rm.version == 1 and restarted.last_key == "run/7"
    assert restarted.durable.latest.endswith("v00000001-u00000001")
    # Up to float rounding (another process, its own thread pool): a model of another version differs by far more.
    assert restarted.rm.logits(restarted.rm.encode(items), batch_size=len(items)) == pytest.approx(scored.logits, abs=1e-5)


def running(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_killing_the_server_takes_its_model_process_with_it(tmp_path: Path) -> None:
    process, ready = serve(tmp_path, "killed")
    model_pid = ready["model_pid"]
    assert model_pid != process.pid and running(model_pid)
    process.kill()  # SIGKILL: no drain, no clean-up code runs in the server
    process.wait(timeout=30)
    deadline = time.monotonic() + 15
    while running(model_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(model_pid), "the model process outlived the server"


def test_the_server_exits_non_zero_when_its_model_process_dies(tmp_path: Path) -> None:
    process, ready = serve(tmp_path, "orphaned")
    try:
        os.kill(ready["model_pid"], signal.SIGKILL)  # e.g. the kernel's OOM killer
        assert process.wait(timeout=60) == 1  # a supervisor restarts it from its latest checkpoint
    finally:
        if process.poll() is None:
            process.kill()


@pytest.mark.slow
def test_callers_killed_mid_update_and_mid_score_leave_the_service_whole(tmp_path: Path) -> None:
    """A client that dies during an Update (the model is training on its pairs) and one that dies while its Score is
    queued behind it: the service keeps answering, the update that reached the model counts once (its retry by the
    same key is a replay, not a second update), and the next update follows it."""
    process, ready = serve(tmp_path, "callers-killed")
    address = f"127.0.0.1:{ready['grpc_port']}"
    setup = ("import sys; sys.path.insert(0, 'tests/reward')\n"
             "from reward_testkit import tiny_items, tiny_pairs\n"
             "from cooper.services.reward.client import RewardClient\n"
             f"c = RewardClient({address!r}); c.wait_ready(30)\n")
    try:
        # 1,024 pairs take about 5 s here; the caller dies a second in.
        kill_mid_call(setup + "pairs = tiny_pairs(1024)", "c.update('run', 0, pairs)", served_for_s=1.0)
        kill_mid_call(setup + "items = tiny_items(3000)", "c.score(items)", served_for_s=0.3)
        with RewardClient(address) as client:
            assert len(client.score(tiny_items(4)).scores) == 4
            retried = client.update("run", 0, tiny_pairs(1024))
            assert retried.replayed and retried.version == 1
            after = client.update("run", 1, tiny_pairs(2))
            assert after.version == 2 and not after.replayed
            assert client.healthy()
        assert process.poll() is None
    finally:
        assert stop(process) == 0

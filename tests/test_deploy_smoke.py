"""The compose smoke run's helpers (deploy/smoke/), without Docker: the CPU rewrite of docker-compose.yml keeps the
file's rules except the GPUs, and the start-order and step checks catch what they are there to catch. The smoke run
itself (deploy/smoke/compose.sh) needs root and minutes and is not part of this suite."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import yaml

from deploy import compose

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "deploy" / "smoke"


def _load(name: str) -> ModuleType:
    # By path: tests/deploy is the package `deploy` on the tests' import path, so deploy/smoke cannot be imported.
    spec = importlib.util.spec_from_file_location(f"smoke_{name}", SMOKE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


cpu_compose, checks = _load("cpu_compose"), _load("compose_checks")


def _smoke_file(tmp_path: Path) -> Path:
    out = tmp_path / "docker-compose.yml"
    subprocess.run([sys.executable, str(SMOKE / "cpu_compose.py"), str(ROOT / "docker-compose.yml"), "-o", str(out),
                    "--env", "COOPER_RUN__STEPS=12", "--cpus", "1"], check=True, timeout=60)
    return out


def test_cpu_compose_drops_only_the_gpus(tmp_path):
    loaded = compose.interpolate(yaml.safe_load(_smoke_file(tmp_path).read_text()), compose.SECRETS_ENV)
    assert compose.schema_problems(loaded) == []
    assert not any(compose._gpu_reserved(s) for s in loaded["services"].values())
    images = {name: s["image"] for name, s in loaded["services"].items()}
    assert images == {"redis": "cooper-redis:bookworm", **{n: "cooper:0.1.0" for n in images if n != "redis"}}
    assert not any("build" in s for s in loaded["services"].values())
    # Every other deployment rule of the real file still holds: the only complaints are the GPUs (the multi-node
    # profile's ranks per node included) and the Redis image (the rules find Redis by the image name redis).
    problems = compose.rule_problems(loaded, ROOT)
    allowed = ("a GPU reservation is missing", "expected the cooper-gpu image", "expected one redis service",
               "but the node gets 0 GPUs; one rank per GPU")
    assert problems and all(any(a in p for a in allowed) for p in problems), problems
    original = compose.load_compose(ROOT / "docker-compose.yml")
    for name, service in loaded["services"].items():
        for key in ("ports", "healthcheck", "volumes", "depends_on", "command", "restart"):
            assert service.get(key) == original["services"][name].get(key), (name, key)
        if name != "redis":
            assert service["environment"] == {**original["services"][name]["environment"], "COOPER_RUN__STEPS": "12"}
            assert service["cpus"] == 1.0


def test_cpu_compose_keeps_other_devices_and_deploy_keys():
    service = {"image": "cooper-gpu:0.1.0", "deploy": {"resources": {
        "limits": {"cpus": "2"},
        "reservations": {"devices": [{"driver": "nvidia", "capabilities": ["gpu"]},
                                     {"driver": "x", "capabilities": ["tpu"]}]}}}}
    out = cpu_compose.smoke_compose({"services": {"policy": service}}, "cooper:smoke", "r", {}, None)["services"]
    assert out["policy"]["deploy"] == {"resources": {"limits": {"cpus": "2"},
                                                     "reservations": {"devices": [{"driver": "x", "capabilities": ["tpu"]}]}}}
    assert out["policy"]["image"] == "cooper:smoke" and "cpus" not in out["policy"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]  # input untouched


def _event(service: str, action: str, t: float) -> dict:
    return {"Type": "container", "Action": action, "timeNano": int(t * 1e9),
            "Actor": {"Attributes": {checks.SERVICE_LABEL: service}}}


COMPOSE = {"services": {
    "redis": {"healthcheck": {"test": ["CMD", "redis-cli", "ping"]}},
    "reward": {"healthcheck": {"test": ["CMD", "x"]}},
    "orchestrator": {"depends_on": {"redis": {"condition": "service_healthy"},
                                    "reward": {"condition": "service_healthy"}}, "healthcheck": {"disable": True}},
    "reward-replica": {"profiles": ["replicas"]},
}}


def test_start_order_accepts_a_health_gated_start():
    events = [_event("redis", "start", 0), _event("reward", "start", 0), _event("redis", "health_status: healthy", 5),
              _event("reward", "health_status: healthy", 40), _event("orchestrator", "start", 41),
              _event("reward", "health_status: healthy", 60)]
    assert checks.start_order_problems(events, COMPOSE) == []


def test_start_order_catches_an_early_start_and_a_service_never_healthy():
    early = [_event("redis", "start", 0), _event("reward", "start", 0), _event("redis", "health_status: healthy", 5),
             _event("orchestrator", "start", 10), _event("reward", "health_status: healthy", 40)]
    assert checks.start_order_problems(early, COMPOSE) == ["orchestrator: started 30.0s before reward was healthy"]
    never = [_event("redis", "start", 0), _event("reward", "start", 0), _event("redis", "health_status: healthy", 5),
             _event("orchestrator", "start", 10), _event("reward", "health_status: unhealthy", 40)]
    assert checks.start_order_problems(never, COMPOSE) == [
        "orchestrator: waits for reward to be healthy, and reward never was", "reward: never reported healthy"]
    assert checks.start_order_problems(never[:3], COMPOSE)[0] == "orchestrator: never started"


def test_step_check_catches_repeats_gaps_and_disorder(tmp_path, capsys):
    assert checks.step_problems([{"step": s} for s in range(4)], 4) == []
    assert checks.step_problems([{"step": s} for s in (0, 1, 1, 3)], 4) == [
        "steps logged more than once: [1]", "steps never logged: [2]"]
    assert checks.step_problems([{"step": s} for s in (1, 0)], 2) == ["steps out of order: [1, 0]"]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "reward": 0.5}) + "\n" for s in range(3)))
    assert checks.main(["steps", str(metrics), "3"]) == 0 and capsys.readouterr().out.strip() == "3"
    assert checks.main(["steps", str(metrics), "4"]) == 1 and "never logged: [3]" in capsys.readouterr().err

"""The compose smoke run's verdicts (compose.sh), as plain functions over what Docker and the run wrote:

    python deploy/smoke/compose_checks.py order EVENTS.jsonl COMPOSE.yml   # health-gated start order
    python deploy/smoke/compose_checks.py steps METRICS.jsonl STEPS        # every step logged once

`order` reads `docker events --format '{{json .}}'` (container start and health_status events) and checks that
every service that waits for another to be healthy (`depends_on: condition: service_healthy`) started after that
one first reported healthy. `steps` reads the run's metrics.jsonl. Each prints what is wrong, one line each, and
exits 1 if anything is; `steps` prints the number of steps logged.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

SERVICE_LABEL = "com.docker.compose.service"


def first_times(events: Iterable[dict[str, Any]]) -> tuple[dict[str, int], dict[str, int]]:
    """(service -> time of its first container start, service -> time it was first healthy), in nanoseconds."""
    started: dict[str, int] = {}
    healthy: dict[str, int] = {}
    for event in events:
        if event.get("Type") != "container":
            continue
        service = (event.get("Actor") or {}).get("Attributes", {}).get(SERVICE_LABEL)
        if not service:
            continue
        action, when = event.get("Action", ""), int(event.get("timeNano", 0))
        if action == "start":
            started[service] = min(started.get(service, when), when)
        elif action == "health_status: healthy":
            healthy[service] = min(healthy.get(service, when), when)
    return started, healthy


def start_order_problems(events: Iterable[dict[str, Any]], compose: dict[str, Any]) -> list[str]:
    """Services that started before a service they wait for (service_healthy) was healthy, or never started."""
    started, healthy = first_times(events)
    problems = []
    for name, service in compose["services"].items():
        if service.get("profiles"):
            continue  # not started by a plain `up`
        depends = service.get("depends_on") or {}
        if name not in started:
            problems.append(f"{name}: never started")
            continue
        for dep, spec in depends.items() if isinstance(depends, dict) else []:
            if spec.get("condition") != "service_healthy":
                continue
            if dep not in healthy:
                problems.append(f"{name}: waits for {dep} to be healthy, and {dep} never was")
            elif started[name] < healthy[dep]:
                problems.append(f"{name}: started {(healthy[dep] - started[name]) / 1e9:.1f}s before {dep} was healthy")
    for name in compose["services"]:
        if (compose["services"][name].get("healthcheck") or {}).get("test") and name in started and \
                not (compose["services"][name].get("healthcheck") or {}).get("disable") and name not in healthy:
            problems.append(f"{name}: never reported healthy")
    return problems


def step_problems(records: list[dict[str, Any]], steps: int) -> list[str]:
    """Steps 0..steps-1 each logged once, in order."""
    logged = [int(r["step"]) for r in records]
    problems = []
    repeated = sorted({s for s in logged if logged.count(s) > 1})
    if repeated:
        problems.append(f"steps logged more than once: {repeated}")
    missing = sorted(set(range(steps)) - set(logged))
    if missing:
        problems.append(f"steps never logged: {missing}")
    if logged != sorted(logged):
        problems.append(f"steps out of order: {logged}")
    return problems


def _json_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "order":
        problems = start_order_problems(_json_lines(Path(argv[1])), yaml.safe_load(Path(argv[2]).read_text()))
    elif len(argv) == 3 and argv[0] == "steps":
        records = _json_lines(Path(argv[1]))
        problems = step_problems(records, int(argv[2]))
        print(len({r["step"] for r in records}))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

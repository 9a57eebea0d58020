"""The embedded default: an embedded Redis and the services a run needs, as local processes on free ports.

They start at once (the generator once the verifier serves, since it needs the verifier's address), and the caller
can go on with its own start-up while they load (`spawn`, then the `with` block waits until each serves).

Services named by an address in the config (`<service>.server.address`) are used as they are and never started.
A started service that dies is started again on its port (`run.service_restarts` times at most) by a watchdog
thread; it resumes from its latest checkpoint (local runs checkpoint after every update) while the clients wait
for it (`server.unavailable_timeout_s`), so the run goes on. Everything started here is stopped on exit, Ctrl-C,
or an error (and, on Linux, when this process is killed: children get SIGTERM from the kernel). The embedded
Redis (embedded_redis.py) appends every write to a file in the run directory, so `cooper train --resume` finds the
run's state; it is stopped on every exit (`close_redis`), and dies with a killed orchestrator too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis

from cooper.config import CooperConfig, mask_url_password
from cooper.launcher.embedded_redis import EmbeddedRedis
from cooper.modes import reward_mode
from cooper.runtime.processes import ServiceProcess, ServiceStartError, start_service, wait_until_ready

log = logging.getLogger("cooper.launcher.local")

START_TIMEOUT_S = 600.0
"""How long a started (or restarted) service may take to serve. Loading a model or importing math-verify takes
seconds on an idle machine and minutes on a loaded one; a service that dies while starting is noticed at once."""


def services_needed(config: CooperConfig) -> list[str]:
    """The services the run calls: its reward mode's (cooper/modes.py), the generator only when it writes the
    negatives (run.negatives)."""
    return reward_mode(config.run.mode).services(config.run.negatives)


def open_redis(config: CooperConfig, run_dir: Path) -> redis.Redis:
    """A client of redis.url, else of an embedded Redis of this run's own (embedded_redis.py); close with
    close_redis."""
    if config.redis.url:
        client = redis.Redis.from_url(config.redis.url, decode_responses=True)
        try:
            client.ping()
        except redis.AuthenticationError as err:
            # The URL is masked: the message lands in logs and on terminals.
            raise redis.AuthenticationError(
                f"Redis at {mask_url_password(config.redis.url)} refused the connection ({err}): put its password "
                f"(requirepass) in redis.url as redis://:PASSWORD@host:port/db") from None
        return client
    return EmbeddedRedis(run_dir / "redis")


def close_redis(client: redis.Redis) -> None:
    """Close the connections; for the embedded Redis also stop its server, which writes out its append-only file."""
    if isinstance(client, EmbeddedRedis):
        start = time.monotonic()
        client.stop()
        log.info("stopped the embedded Redis in %.1f s", time.monotonic() - start)
    else:
        client.close()


class LocalServices:
    """Context manager: start what the run needs, expose `addresses`, restart what dies, stop it all on exit."""

    def __init__(self, config: CooperConfig, config_path: Path, run_dir: Path, names: Sequence[str] | None = None,
                 on_lost: Callable[[str], None] | None = None):
        """`names`: the services to provide; by default those the run calls (`services_needed`). `on_lost(message)` is called
        when a service died and cannot be restarted (the run should stop with that message)."""
        self.config, self.config_path, self.run_dir = config, config_path, run_dir
        self.names = list(names) if names is not None else services_needed(config)
        self.on_lost = on_lost
        self.started: list[ServiceProcess] = []
        self.addresses: dict[str, str] = {}
        self.lost: dict[str, str] = {}
        """Services given up on, with why."""
        self._stopping = threading.Event()
        self._lock = threading.Lock()  # between the watchdog's respawn and stop(): nothing is started after stop
        self._watchdog: threading.Thread | None = None
        self._spawned = False
        self._local: list[str] = []
        """The services this run starts (those without an address in the config)."""

    def __enter__(self) -> LocalServices:
        try:
            if not self._spawned:
                self.spawn()
            self._wait()
        except BaseException:
            self.stop()
            raise
        if self.started and self.config.run.service_restarts > 0:
            # The watchdog thread also forks the restarted services, which get SIGTERM when the thread that forked
            # them ends (processes.die_with_parent); it lives until stop() has stopped them.
            self._watchdog = threading.Thread(target=self._watch, name="service-watchdog", daemon=True)
            self._watchdog.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def spawn(self) -> None:
        """Start the processes of every local service but the generator, all at once, without waiting for them
        (the `with` block waits): the caller can do its own start-up (Redis, imports) while they load. Call it from
        a thread that lives as long as they do (the main one; see processes.die_with_parent)."""
        self._spawned = True
        for name in self.names:
            address = getattr(self.config, name).server.address
            if address:
                self.addresses[name] = address
        self._local = [n for n in self.names if n not in self.addresses]
        # The generator needs the verifier's address, known once the verifier serves: _wait starts it then.
        for name in self._local:
            if name != "generator":
                self.started.append(start_service(name, self.config_path, log_dir=self.run_dir / "logs", wait=False))

    def _wait(self) -> None:
        """Until every local service serves; the generator is started as soon as the verifier serves."""
        if "generator" in self._local and all(s.name != "generator" for s in self.started):
            verifier = next((s for s in self.started if s.name == "verifier"), None)
            if verifier is not None:  # the others go on starting meanwhile
                wait_until_ready([verifier], timeout_s=START_TIMEOUT_S)
                self.addresses["verifier"] = verifier.address
            self.started.append(start_service(
                "generator", self.config_path, [f"verifier.server.address={self.addresses['verifier']}"],
                log_dir=self.run_dir / "logs", wait=False))
        if self.started:
            log.info("waiting for %s", ", ".join(s.name for s in self.started))
            wait_until_ready(self.started, timeout_s=START_TIMEOUT_S)
        for service in self.started:
            self.addresses[service.name] = service.address

    def _watch(self, poll_s: float = 0.5) -> None:
        """Until stop(): restart each started service that exited, up to run.service_restarts times each."""
        while not self._stopping.wait(poll_s):
            for service in list(self.started):
                if service.name not in self.lost and service.process.poll() is not None:
                    self._revive(service)

    def _revive(self, service: ServiceProcess) -> None:
        """Start a dead service again and wait until it serves; report it lost if it cannot be."""
        code, limit = service.process.returncode, self.config.run.service_restarts
        if service.restarts >= limit:
            self._give_up(service, f"the {service.name} service died (exit code {code}) after {limit} restarts "
                                   f"(run.service_restarts); its log: {service.log_path}")
            return
        log.warning("service %s died (exit code %s); restarting it from its latest checkpoint (restart %d of %d)",
                    service.name, code, service.restarts + 1, limit)
        start = time.monotonic()
        with self._lock:
            if self._stopping.is_set():
                return
            service.respawn()
        try:
            # Outside the lock: stop() must not wait for a model to load; it stops the new process instead.
            wait_until_ready([service], timeout_s=START_TIMEOUT_S)
        except ServiceStartError as err:
            if self._stopping.is_set():
                return
            if service.process.poll() is not None:
                # It died again while starting (killed, or it crashed): the next poll restarts it like any death,
                # so run.service_restarts alone bounds the tries (a service that cannot start uses them all up).
                log.warning("service %s died again while restarting (exit code %s)", service.name,
                            service.process.returncode)
                return
            self._give_up(service, f"the {service.name} service died (exit code {code}) and did not come back: {err}")
            return
        log.warning("service %s is back on %s after %.1f s", service.name, service.address, time.monotonic() - start)

    def _give_up(self, service: ServiceProcess, message: str) -> None:
        log.error("%s", message)
        self.lost[service.name] = message
        if self.on_lost is not None:
            self.on_lost(message)

    def stop(self, grace_s: float = 15.0) -> None:
        """Stop every started service, then the watchdog. All are sent SIGTERM at once and drain side by side (a
        run that stops abandons its in-flight calls, so none waits on another's drain): stopping takes the slowest
        service's drain, not the sum of them all; whatever still runs after grace_s is killed."""
        self._stopping.set()
        start = time.monotonic()
        with self._lock:
            for service in self.started:
                service.terminate()
            deadline = start + grace_s
            for service in self.started:
                code = service.stop(grace_s=max(0.0, deadline - time.monotonic()))
                if code not in (0, None) and service.name not in self.lost:
                    log.warning("service %s exited with %s; its log: %s", service.name, code, service.log_path)
            if self.started:
                log.info("stopped %s in %.1f s", ", ".join(s.name for s in self.started), time.monotonic() - start)
            self.started.clear()
        if self._watchdog is not None and self._watchdog is not threading.current_thread():
            self._watchdog.join(timeout=30)

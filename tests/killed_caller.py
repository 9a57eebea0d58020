"""A gRPC caller in a process of its own, killed while its call is being served: a client that goes away."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kill_mid_call(setup: str, call: str, served_for_s: float) -> None:
    """Run `setup` then `call` (Python source) in a new process, SIGKILL it `served_for_s` seconds after the call
    went out, and wait until it is gone. The call must still be in flight by then: a test asserting what the server
    does afterwards would otherwise test nothing. `setup` runs before the timer starts (imports, connecting)."""
    source = f"{setup}\nimport sys\nprint('calling', flush=True)\n{call}\nprint('answered', flush=True)\n"
    process = subprocess.Popen([sys.executable, "-c", source], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line == "calling\n", f"the caller failed before its call (exit {process.wait()})"
        time.sleep(served_for_s)
        assert process.poll() is None, "the call was answered before the caller was killed: make it slower"
    finally:
        process.kill()
        process.wait(timeout=30)

"""Run a command while every core is kept busy by other work: what CI's shared machines do to a test.

    python bench/under_load.py [--hogs N] [--repeat K] -- COMMAND ...

Starts N busy-loop processes (default: one per core), runs COMMAND K times in a row (stopping at the first
failure), stops the hogs, and prints one JSON line last: each run's exit code and wall time. A liveness limit in a
test (a run that logs no step for N s is stuck) must hold here, not only on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import time


def _spin() -> None:
    """Busy-loop at the command's own priority: a hog at a lower one would not compete."""
    while True:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hogs", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of COMMAND in a row (default 1)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    hogs = [mp.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for hog in hogs:
        hog.start()
    runs = []
    try:
        for _ in range(args.repeat):
            start = time.monotonic()
            code = subprocess.run(command).returncode
            runs.append({"exit": code, "seconds": round(time.monotonic() - start, 1)})
            if code != 0:
                break
    finally:
        for hog in hogs:
            hog.kill()
    print(json.dumps({"command": command, "hogs": args.hogs, "runs": runs,
                      "passed": len(runs) == args.repeat and all(r["exit"] == 0 for r in runs)}))
    return 0 if runs and all(r["exit"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

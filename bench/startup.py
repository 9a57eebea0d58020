"""Start-up: seconds from typing a 30-step training command to its first step done, Cooper against TRL.

    python bench/startup.py [--rounds 3] [--steps 30] [--modes rule,cooper] [--eval preset|off]
                            [--trl-python PYTHON] [--trl-threads 1] [--no-trl] [--baseline PATH] [--whole]

Contenders, each a command started from this script as a user starts it, one at a time:

- `cooper train run.mode=MODE run.steps=STEPS` for each of --modes (the tiny preset: an embedded Redis and the
  services the mode needs, started on this machine). Its first step is done when the first line of
  `runs/<name>/metrics.jsonl` is there (the driver writes it once every job of step 0 has finished), seen by polling
  every 10 ms.
- bench/peers/trl_grpo.py: the same GRPO work as the preset's rule mode in TRL's GRPOTrainer (same model, prompts in
  the same order, lengths, loss, optimizer; its docstring has the settings), in an environment of its own (`bash
  bench/peers/setup.sh trl`). Its first step is done at its first `on_step_end`, timestamped inside it. With several
  --trl-threads, each thread count is a contender and every ratio is taken against the fastest of them in its round.
- with --baseline PATH, `cooper train` of another checkout (a worktree of main before a change), as `baseline-MODE`.

The tiny preset evaluates the initial policy before its first update (evaluate(-1): 2 samples of each of the 512
test problems), so with `--eval preset` (the default) TRL evaluates on the same problems before its first step too
(`eval_on_start`); `--eval off` turns evaluation off on both sides (`eval.every=0`), leaving start-up and one step.
The models are built (or found in the cache) before the first round, so no command builds them. Every command runs
as in a user's shell: Python's bytecode caches on (`PYTHONDONTWRITEBYTECODE` dropped), the checkouts compiled first.

Rounds alternate the contenders' order (each round starts one later in the list). By default each command is
stopped at its first step (SIGINT for Cooper, which stops its services and Redis; the bench waits for it to exit
before the next starts); `--whole` lets it finish and also reports the whole command's time. Reported: per
contender the median time to the first step (and when each of Cooper's services was serving, from its log; when
TRL's trainer was built, its models loaded), and the median over rounds of each round's ratio to TRL (and to the
baseline). The last line printed is one JSON object. `--no-trl` runs Cooper alone (the suite's smoke test).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SERVING = re.compile(r"^(\S+ \S+) INFO cooper\.runtime: (\w+) serving gRPC")


@dataclass
class Contender:
    name: str
    kind: str  # "cooper" or "trl"
    command: list[str]
    env: dict[str, str]
    run_dir: Path | None = None  # cooper: where metrics.jsonl appears
    times: list[dict[str, Any]] = field(default_factory=list)


def write_data(steps: int, workdir: Path) -> tuple[str, Path, Path]:
    """The preset's policy model directory (built if need be), its rule-mode prompts of `steps` steps in its order,
    and its test problems, as JSON Lines of prompt and answer (what trl_grpo.py reads)."""
    from cooper.config import load_config, preset_path
    from cooper.launcher.launch import prepare_models
    from cooper.orchestrator.data import StepData, load_data, prompt_text

    config = load_config(preset_path("tiny"), ["run.mode=rule", f"run.steps={steps}"])
    prepare_models(config, reward=True)  # the cooper row's VerifyRM too: no command below builds a model
    from cooper.runtime.models import resolve_model

    rows, tests = load_data(config)
    data = StepData(rows, config.run.batch_size, config.run.seed)
    train, test = workdir / "train.jsonl", workdir / "test.jsonl"
    train.write_text("".join(json.dumps({"prompt": prompt_text(config, e), "answer": e.answer}) + "\n"
                             for t in range(steps) for e in data.batch(t)))
    test.write_text("".join(json.dumps({"prompt": prompt_text(config, e), "answer": e.answer}) + "\n"
                            for problems in tests.values() for e in problems))
    return resolve_model(config.policy.model, "causal"), train, test


def cooper_contender(name: str, checkout: Path, mode: str, args: argparse.Namespace, workdir: Path) -> Contender:
    run_name = f"{name}-{{round}}"
    command = [sys.executable, "-m", "cooper.cli", "train", f"run.mode={mode}", f"run.steps={args.steps}",
               f"run.output_dir={workdir / 'runs'}", f"run.name={run_name}"]
    if args.eval == "off":
        command.append("eval.every=0")
    # Its own code first on the path (the services inherit it), as bench/reward_http.py runs a baseline.
    env = {**user_environment(), "PYTHONPATH": str(checkout)}
    return Contender(name, "cooper", command, env, run_dir=workdir / "runs" / run_name)


def trl_contender(threads: int, model: str, train: Path, test: Path, args: argparse.Namespace,
                  workdir: Path) -> Contender:
    command = [args.trl_python, str(ROOT / "bench" / "peers" / "trl_grpo.py"), "--model", model, "--data", str(train),
               "--steps", str(args.steps), "--threads", str(threads), "--output-dir", str(workdir / f"trl-{threads}")]
    if args.eval == "preset":
        command += ["--eval-data", str(test)]
    return Contender(f"trl-{threads}t", "trl", command, {**user_environment(), "PYTHONPATH": str(ROOT)})


def user_environment() -> dict[str, str]:
    """This environment as a user's shell has it: Python writes and reads bytecode caches (a sandbox or CI job that
    sets PYTHONDONTWRITEBYTECODE makes every process compile Cooper's source again, while the installed packages,
    TRL's among them, were compiled by pip)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def compile_checkout(checkout: Path) -> None:
    """Its bytecode caches (__pycache__, ignored by git), as the first command a user runs there leaves them."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "cooper"), str(checkout / "bench")],
                   check=True, env=user_environment(), stdout=subprocess.DEVNULL)


def serving_times(logs: Path, start: float) -> dict[str, float]:
    """Seconds from the command's start to each service's "serving gRPC" line in its log."""
    out = {}
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if m := SERVING.match(line):
                when = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                out[m.group(2)] = round(when - start, 2)
                break
    return out


def run_once(c: Contender, round_no: int, whole: bool, timeout_s: float) -> dict[str, Any]:
    """Start the command, wait for its first step (and its end with `whole`), stop it; the times from its start."""
    command = [part.replace("{round}", str(round_no)) for part in c.command]
    run_dir = Path(str(c.run_dir).replace("{round}", str(round_no))) if c.run_dir else None
    out_path = Path(tempfile.mkstemp(prefix=f"startup-{c.name}-", suffix=".out")[1])
    with open(out_path, "w") as out:
        start = time.time()
        process = subprocess.Popen(command, stdout=subprocess.PIPE if c.kind == "trl" else out, stderr=out,
                                   env=c.env, cwd=out_path.parent, text=True)
    first = ready = None
    if c.kind == "trl":
        assert process.stdout is not None
        for line in process.stdout:  # its events, timestamped inside it (TRL's own logs print dicts too)
            if line.startswith('{"event": "ready"'):
                ready = json.loads(line)["time"] - start
            if line.startswith('{"event": "step"'):
                first = json.loads(line)["time"] - start
                break
    else:
        metrics = run_dir / "metrics.jsonl"  # type: ignore[operator]
        while process.poll() is None and time.time() - start < timeout_s:
            if metrics.is_file() and metrics.read_text().endswith("\n"):
                first = time.time() - start
                break
            time.sleep(0.01)
    if first is None:
        process.kill()
        process.wait()
        raise RuntimeError(f"{c.name} reached no first step (exit {process.returncode}); its output: {out_path}")
    result: dict[str, Any] = {"first_step_s": round(first, 2)}
    if ready is not None:
        result["trainer_built_s"] = round(ready, 2)
    if whole:
        if process.stdout is not None:
            for _ in process.stdout:
                pass
        code = process.wait(timeout=timeout_s)
        result["whole_s"] = round(time.time() - start, 2)
        if code != 0:
            raise RuntimeError(f"{c.name} exited with {code}; its output: {out_path}")
    elif c.kind == "cooper":
        process.send_signal(signal.SIGINT)  # cooper train stops its services and Redis, then exits
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:  # its time is taken; a stop that hangs is reported, not waited for
            result["stop"] = "killed 120 s after Ctrl-C"
            process.kill()  # its services and Redis get SIGTERM from the kernel (processes.die_with_parent)
            process.wait()
            time.sleep(15)
    else:
        process.kill()
        process.wait()
    if run_dir is not None:
        result["serving_s"] = serving_times(run_dir / "logs", start)
    out_path.unlink()
    return result


def ratios(contenders: list[Contender], name: str, against: list[str]) -> list[float]:
    """Per round: `name`'s first-step time over the fastest of `against` in that round."""
    by_name = {c.name: c for c in contenders}
    rounds = len(by_name[name].times)
    return [by_name[name].times[r]["first_step_s"] / min(by_name[a].times[r]["first_step_s"] for a in against)
            for r in range(rounds)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--modes", default="rule,cooper", help="Cooper's modes to run (comma-separated)")
    parser.add_argument("--eval", choices=("preset", "off"), default="preset",
                        help="preset: the tiny preset's evaluation of the initial policy, and TRL's on the same "
                             "problems; off: none on either side")
    default_trl = Path(os.environ.get("COOPER_BENCH_PEERS", Path.home() / ".cache" / "cooper" / "bench-peers"))
    parser.add_argument("--trl-python", default=str(default_trl / "trl" / "bin" / "python"),
                        help="the TRL environment's python (bench/peers/setup.sh trl makes it)")
    parser.add_argument("--trl-threads", default="1", help="torch threads of TRL, comma-separated: each a contender")
    parser.add_argument("--no-trl", action="store_true", help="Cooper alone (and --baseline): no ratios to TRL")
    parser.add_argument("--baseline", metavar="PATH", help="also run `cooper train` of this checkout")
    parser.add_argument("--whole", action="store_true", help="let every command finish; report its time too")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one command may take")
    args = parser.parse_args()
    if not args.no_trl and not Path(args.trl_python).is_file():
        parser.error(f"no TRL environment at {args.trl_python}: run `bash bench/peers/setup.sh trl` or pass "
                     f"--trl-python")
    modes = [m for m in args.modes.split(",") if m]
    workdir = Path(tempfile.mkdtemp(prefix="cooper-startup-"))
    model, train, test = write_data(args.steps, workdir)
    for checkout in [ROOT] + ([Path(args.baseline)] if args.baseline else []):
        compile_checkout(checkout)
    contenders = [] if args.no_trl else [trl_contender(int(t), model, train, test, args, workdir)
                                         for t in args.trl_threads.split(",")]
    for mode in modes:
        contenders.append(cooper_contender(f"cooper-{mode}", ROOT, mode, args, workdir))
        if args.baseline:
            contenders.append(cooper_contender(f"baseline-{mode}", Path(args.baseline).resolve(), mode, args, workdir))
    for r in range(args.rounds):
        order = contenders[r % len(contenders):] + contenders[: r % len(contenders)]
        for c in order:
            c.times.append(run_once(c, r, args.whole, args.timeout))
            print(f"round {r}: {c.name} {json.dumps(c.times[-1])}", flush=True)
    trl = [c.name for c in contenders if c.kind == "trl"]
    result: dict[str, Any] = {"rounds": args.rounds, "steps": args.steps, "eval": args.eval, "whole": args.whole,
                              "cpus": os.cpu_count(), "first_step_s": {}, "ratio_to_trl": {}}
    for c in contenders:
        result["first_step_s"][c.name] = round(statistics.median(t["first_step_s"] for t in c.times), 2)
        if args.whole:
            result.setdefault("whole_s", {})[c.name] = round(statistics.median(t["whole_s"] for t in c.times), 2)
        if c.kind == "trl":
            result.setdefault("trainer_built_s", {})[c.name] = round(
                statistics.median(t["trainer_built_s"] for t in c.times), 2)
        if c.kind == "cooper":
            services = sorted({s for t in c.times for s in t.get("serving_s", {})})
            result.setdefault("serving_s", {})[c.name] = {
                s: round(statistics.median(t["serving_s"][s] for t in c.times if s in t["serving_s"]), 2)
                for s in services}
            if trl:
                per_round = ratios(contenders, c.name, trl)
                result["ratio_to_trl"][c.name] = {"median": round(statistics.median(per_round), 3),
                                                  "rounds": [round(x, 3) for x in per_round]}
    if args.baseline:
        result["ratio_to_baseline"] = {}
        for mode in modes:
            per_round = ratios(contenders, f"cooper-{mode}", [f"baseline-{mode}"])
            result["ratio_to_baseline"][f"cooper-{mode}"] = {"median": round(statistics.median(per_round), 3),
                                                              "rounds": [round(x, 3) for x in per_round]}
    shutil.rmtree(workdir, ignore_errors=True)  # kept when a round fails: its runs and logs are there
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

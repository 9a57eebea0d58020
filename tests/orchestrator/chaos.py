"""SIGKILLs at seeded random moments of a real run, and the invariants the run must keep through them.

Used by bench/chaos.py (40 steps, 3 seeds, both recipes) and test_chaos.py (one small seed). The targets are every
service the run starts, the `cooper train` CLI and its embedded Redis. Stage workers are threads of the CLI
(docs/design.md, section 8), so killing the CLI kills them too: there is no worker process to kill on its own. A
kill that ends the CLI (the CLI itself, or Redis: the run stops with RunFailed) is followed by `cooper train
--resume`. A kill can also wait for a job of one stage to be running and land inside it (`Kill.during`): the policy
in the middle of a GRPO update and the reward service in the middle of a Bradley-Terry update (every run: what their
update journals are for), the generator while it writes a step's negatives, or the policy while it samples an
evaluation; one that finds no such job, or lands after the job ended, did not land, and counts against the run.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import redis
from train_process import FAST, SERVICES, Train

from cooper.modes import PAPER_RECIPE
from cooper.orchestrator.outputs import read_metrics

TARGETS = (*SERVICES, "cli", "redis")
"""What a run can lose; with negatives from the rollouts alone no generator runs, so a run cannot lose it."""
EXACT = ("step", "prompt_ids", "data_epoch", "data_offset", "policy_version", "policy_version_sampled",
         "reward_version_used", "reward_version", "pairs", "positive_rate", "valid_pair_rate", "verifier_accuracy",
         "no_answer_rate")
"""Fields that must equal the uninterrupted run's exactly: the data order, the versions, and what the verifier
and the generator decided (integers and ratios of integers)."""
RECIPES = {
    "rollouts": ("run.negatives=rollouts",),
    "generator": PAPER_RECIPE,
}
"""Negatives from the policy's own rejected rollouts (no generator runs) and the paper's recipe (the generator writes
every negative; docs/experiments.md, section 0). The tiny preset takes both kinds: the generator's path is the
paper recipe's, the rollouts' path the variant's."""
IN_UPDATES = (("policy", "policy_update"), ("reward", "reward_update"))
"""The services killed in the middle of their own update, in every run: each comes back from its checkpoint plus its
update journal (cooper/runtime/durability.py), and the retried update is applied once."""
EVAL_TARGETS = ("policy", "verifier", "cli")
"""What an evaluation calls (the policy samples, the verifier checks) and the CLI, whose resume re-runs it."""
WAITED_S = 0.5
"""A negatives job that a generator kill landed inside waits for the restarted generator (seconds: a new process
loads its model and binds its port); one that took less had its answer before the kill."""
STUCK_S = 600.0
"""A run that logs no step for this long (seconds) is stuck: the harness stops it and reports where each process
was (train_process.Train.stuck_report) instead of waiting on."""
REL_TOL = 1e-4
"""Every other number (rewards, losses, KL, pair accuracies) within this relative tolerance (abs 1e-6 near zero).
Measured on the tiny preset: they are exactly equal too (bench/chaos.py prints the largest difference); the
tolerance only keeps the check from depending on float summation order, which no invariant promises."""


@dataclass
class Kill:
    target: str
    after_step: int
    delay_s: float
    during: str | None = None
    """A stage (policy_update, reward_update, negatives, evaluate): the kill waits for one of its jobs to be running
    and lands inside it."""
    logged: int = -1
    """Steps logged when the kill was sent; -1: never sent (the run had finished, or no `during` job came)."""
    inside: str | None = None
    """With `during`: the job that was running when the kill was sent and still was just after it."""
    seconds_to_next_step: float | None = None
    ended_cli: bool = False

    @property
    def sent(self) -> bool:
        return self.logged >= 0

    @property
    def landed(self) -> bool:
        return self.sent and (self.during is None or self.inside is not None)

    def describe(self) -> str:
        return f"{self.target}@{self.after_step}+{self.delay_s}s" + (f" in {self.during}" if self.during else "")


@dataclass
class ChaosRun:
    seed: int
    steps: int
    kills: list[Kill]
    recipe: str = "rollouts"
    max_staleness: int = 0
    reward_max_staleness: int = 0
    wall_s: float = 0.0
    resumes: int = 0
    steps_redone: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    max_rel_diff: dict[str, float] = field(default_factory=dict)
    left_in_tmp: list[str] = field(default_factory=list)
    checkpoint_values_compared: int = 0
    """Tensors and bookkeeping values of the final policy and VerifyRM checkpoints compared bit for bit with the
    uninterrupted run's (check)."""
    checkpoint_differences: list[str] = field(default_factory=list)
    """Where those differ (each one is a violation too)."""

    evaluations: int = 0
    """Evaluate jobs in the run's records (the initial one included)."""

    @property
    def landed(self) -> list[Kill]:
        return [k for k in self.kills if k.landed]

    @property
    def not_landed(self) -> list[Kill]:
        """Kills that were never sent, or that were meant to land inside a job and did not: failures, not passes."""
        return [k for k in self.kills if not k.landed]

    @property
    def survived(self) -> int:
        """Kills after which the run logged another step (or, for a kill after the last step, completed)."""
        return sum(k.seconds_to_next_step is not None for k in self.kills if k.sent)

    @property
    def generator_kills_in_negatives(self) -> int:
        return sum(k.target == "generator" and (k.inside or "").startswith("negatives:") for k in self.landed)


def schedule(seed: int, steps: int, kills: int, targets: tuple[str, ...] | None = None, recipe: str = "rollouts",
             eval_every: int = 0) -> list[Kill]:
    """`kills` kills, each target at least once when there are enough, spread over the run (the k-th near step
    k * steps / (kills + 1), seeded +-1) with a seeded delay of 0-2 s; plus the policy and the reward service each
    inside one of its updates (IN_UPDATES), with `eval_every` one inside an evaluation (a seeded EVAL_TARGETS), and
    with the paper's recipe one of the generator inside a negatives job, each at a seeded place among the others."""
    if targets is None:
        targets = TARGETS if recipe == "generator" else tuple(t for t in TARGETS if t != "generator")
    inside = [Kill(target, 0, 0.0, during=stage) for target, stage in IN_UPDATES] + \
        ([Kill(random.Random(seed).choice(EVAL_TARGETS), 0, 0.0, during="evaluate")] if eval_every else []) + \
        ([Kill("generator", 0, 0.0, during="negatives")] if recipe == "generator" else [])
    total = kills + len(inside)
    if kills < 1 or steps - 2 < total:
        raise ValueError(f"{total} kills need at least {total + 2} steps (one kill per step, none in the first or "
                         f"last); got {steps} steps")
    rng = random.Random(seed)
    picked = rng.sample(targets, min(kills, len(targets))) + [rng.choice(targets) for _ in range(kills - len(targets))]
    every = [Kill(t, 0, round(rng.uniform(0.0, 2.0), 2)) for t in picked]
    for kill in inside:
        every.insert(rng.randint(0, len(every)), kill)
    # Spread, not sampled: clustered kills land one after the other's recovery, late in the run. Sorted, so that the
    # seeded +-1 never puts a kill before the one ahead of it.
    after = sorted(min(steps - 2, max(1, round((k + 1) * steps / (total + 1)) + rng.randint(-1, 1)))
                   for k in range(total))
    for kill, step in zip(every, after, strict=True):
        kill.after_step = step
    return every


def run_args(tmp: Path, name: str, seed: int, steps: int, recipe: str = "rollouts", eval_every: int = 0,
             max_staleness: int = 0, reward_max_staleness: int = 0) -> list[str]:
    if recipe not in RECIPES:
        raise ValueError(f"unknown recipe {recipe!r}: one of {', '.join(RECIPES)}")
    # 64 of the 256 test problems: an evaluation still lasts long enough (about a second) for a kill to land inside.
    return [f"run.steps={steps}", f"run.name={name}", f"run.output_dir={tmp}", f"run.seed={seed}", *FAST,
            f"eval.every={eval_every}", "eval.max_problems=64", f"run.max_staleness={max_staleness}",
            f"run.reward_max_staleness={reward_max_staleness}", *RECIPES[recipe]]


def uninterrupted(tmp: Path, seed: int, steps: int, recipe: str = "rollouts", eval_every: int = 0,
                  stuck_s: float = STUCK_S, max_staleness: int = 0, reward_max_staleness: int = 0
                  ) -> tuple[list[dict[str, Any]], float]:
    """The records and wall time of the same run without kills."""
    start = time.monotonic()
    train = Train(tmp, *run_args(tmp, f"calm-{seed}", seed, steps, recipe, eval_every, max_staleness,
                                 reward_max_staleness))
    assert train.wait_while_it_logs(tmp / f"calm-{seed}", stuck_s) == 0, train.stderr[-3000:]
    return read_metrics(tmp / f"calm-{seed}"), time.monotonic() - start


def _pid_of(train: Train, target: str) -> psutil.Process:
    if target == "cli":
        return psutil.Process(train.proc.pid)
    deadline = time.monotonic() + 60  # a service being restarted after an earlier kill is not there yet
    while True:
        try:
            if target == "redis":
                found = [p for p in train.look() if p.name() == "redis-server"]
                if found:
                    return found[0]
                raise AssertionError("no embedded Redis under the CLI")
            return train.service(target)
        except (AssertionError, psutil.NoSuchProcess):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_with_kills(tmp: Path, seed: int, steps: int, kills: list[Kill], say: Callable[[str], None] = print,
                   recipe: str = "rollouts", eval_every: int = 0, stuck_s: float = STUCK_S,
                   max_staleness: int = 0, step_s: float | None = None, reward_max_staleness: int = 0) -> ChaosRun:
    """Run `steps` steps of seed `seed`, SIGKILLing each target in `kills` once `after_step` steps are logged plus
    `delay_s` (and, with `during`, once a job of that stage runs); resume whenever the CLI ended. Records what
    happened; checks come after (check).

    `step_s` (the uninterrupted run's wall time per step) caps each delay: a delay is a moment within the step after
    `after_step`, and on a run whose steps are shorter than the 0-2 s the schedule draws (rule mode, rollouts ahead
    of training) the delays would add up until the last kills came after the run had ended."""
    name = f"chaos-{seed}"
    run_dir, chaos = tmp / name, ChaosRun(seed, steps, kills, recipe, max_staleness, reward_max_staleness)
    start = time.monotonic()
    train, trains = Train(tmp, *run_args(tmp, name, seed, steps, recipe, eval_every, max_staleness,
                                         reward_max_staleness)), []
    trains.append(train)
    for kill in kills:
        train.wait_for_steps(run_dir, kill.after_step, timeout_s=stuck_s)
        time.sleep(kill.delay_s if step_s is None else min(kill.delay_s, step_s))
        if train.proc.poll() is not None:  # the run finished before this kill's moment
            break
        killed_at = time.monotonic()
        victim = _kill_inside(train, run_dir, kill, stuck_s) if kill.during else _kill(train, kill.target)
        if victim is None:  # no job of that stage ran before the run ended
            break
        kill.logged = len(read_metrics(run_dir))
        say(f"seed {seed}: SIGKILL {kill.target} (pid {victim.pid}) with {kill.logged} steps logged"
            + (f", inside {kill.inside or f'no {kill.during} job (it had ended)'}" if kill.during else ""))
        if kill.target in ("cli", "redis"):
            code = train.wait(timeout_s=120)
            kill.ended_cli = True
            # A Redis killed after the last step's writes lets the run end well; else it stops with why.
            finished = code == 0 and len(read_metrics(run_dir)) == steps
            if kill.target == "redis" and not finished and (code != 1 or "embedded Redis died" not in train.stderr):
                chaos.violations.append(f"a killed Redis did not stop the run with its message (exit {code}):\n"
                                        f"{train.stderr[-2000:]}")
            train.wait_for_children_to_exit()
            train = Train(tmp, "--resume", str(run_dir))
            trains.append(train)
            chaos.resumes += 1
        if kill.logged < steps:
            try:
                train.wait_for_steps(run_dir, kill.logged + 1, timeout_s=stuck_s)
                kill.seconds_to_next_step = time.monotonic() - killed_at
            except AssertionError as err:
                chaos.violations.append(f"after the SIGKILL of {kill.target}: {str(err)[:2000]}")
                break
    code = train.wait_while_it_logs(run_dir, stuck_s)
    chaos.wall_s = time.monotonic() - start
    if code != 0:
        chaos.violations.append(f"the run ended with exit code {code}:\n{train.stderr[-3000:]}")
    for kill in kills:
        if kill.sent and kill.logged >= steps and code == 0:
            kill.seconds_to_next_step = 0.0
    records = read_metrics(run_dir)
    chaos.evaluations = sum(key.startswith("time/evaluate") for r in records for key in r)
    _confirm_generator_kills(kills, records)
    for kill in chaos.not_landed:
        chaos.violations.append(f"the SIGKILL {kill.describe()} did not land: " + (
            "the run had ended" if not kill.sent else f"no {kill.during} job was running when it was sent"))
    redone = set()
    for t in trains:
        for job in re.findall(r"re-queueing job \w+:(-?\d+)|job \w+:(-?\d+) failed \(attempt", t.stderr):
            redone.add(int(job[0] or job[1]))
    chaos.steps_redone = sorted(redone)
    for t in trains:
        try:
            t.assert_nothing_left()
        except AssertionError as err:
            chaos.violations.append(f"left behind: {err}")
    return chaos


def _kill(train: Train, target: str) -> psutil.Process:
    victim = _pid_of(train, target)
    victim.send_signal(signal.SIGKILL)
    return victim


FREEZE_S = 0.1
"""How long a target stays frozen before a kill meant for inside a job: long enough for a stage worker that already
had the job's answer to record it."""


def _kill_inside(train: Train, run_dir: Path, kill: Kill, timeout_s: float = 300) -> psutil.Process | None:
    """SIGKILL kill.target (serving, for a service) as soon as a job of stage kill.during is running, and set
    kill.inside to that job if its status was unchanged just after the kill. None if no such job ran before the run
    ended or `timeout_s`."""
    # The job statuses the stage workers write (run_store.RunStore), read from the run's embedded Redis through a short
    # link: the run directory's path may be too long for an AF_UNIX socket (embedded_redis.SOCKET_PATH_MAX).
    link = Path(tempfile.mkdtemp(prefix="chaos-", dir="/tmp")) / "redis"
    link.symlink_to(run_dir / "redis")
    store = redis.Redis(unix_socket_path=str(link / "redis.sock"), decode_responses=True)
    # Steps 0..after_step-1 are logged, so all their jobs are done: the job to land in is of a later step.
    status_key, jobs = f"cooper:{run_dir.name}:status", [f"{kill.during}:{s}" for s in range(kill.after_step,
                                                                                              kill.after_step + 64)]
    deadline, ready = time.monotonic() + timeout_s, run_dir / "logs" / f"{kill.target}.ready.json"
    try:
        victim = _pid_of(train, kill.target)
        # A job that a killed CLI left "running" keeps that status until the resumed run takes it again: not a job
        # of this process's workers.
        since = psutil.Process(train.proc.pid).create_time()
        while time.monotonic() < deadline and train.proc.poll() is None:
            try:
                running = [(job, record) for job, record in zip(jobs, store.hmget(status_key, jobs), strict=True)
                           if record and _running_since(record, since)]
            except redis.ConnectionError:  # Redis restarting after an earlier kill
                time.sleep(0.1)
                continue
            # A service that the watchdog is still restarting (after an earlier kill) is not yet serving the job.
            if not running or (kill.target in SERVICES and not ready.exists()):
                time.sleep(0.001)  # a negatives job of the tiny preset runs for about 15 ms
                continue
            job, record = running[0]
            if not _alive(victim):  # restarted after an earlier kill: a new process
                victim = _pid_of(train, kill.target)
            # Freeze the target first: a job waiting on it cannot end while it is frozen, so if the job is still
            # running a moment later (its answer was not already on its way) the kill lands inside it. A job that
            # ended meanwhile (a 0.5 s update can end between the look above and the kill) is let go, and the kill
            # waits for the next job of that stage.
            victim.send_signal(signal.SIGSTOP)
            time.sleep(FREEZE_S)
            if not _status_unchanged(store, status_key, job, record, if_unreachable=False):
                victim.send_signal(signal.SIGCONT)
                continue
            victim.send_signal(signal.SIGKILL)
            # Redis unreachable after the kill: the CLI took its Redis with it, and no worker can have moved the job on
            kill.inside = job if _status_unchanged(store, status_key, job, record,
                                                   if_unreachable=kill.target == "cli") else None
            return victim
        return None
    finally:
        store.close()
        shutil.rmtree(link.parent)


def _status_unchanged(store: redis.Redis, status_key: str, job: str, record: str, if_unreachable: bool) -> bool:
    """Whether `job`'s status record is still `record`; `if_unreachable` when Redis does not answer."""
    try:
        return store.hget(status_key, job) == record
    except redis.ConnectionError:
        return if_unreachable


def _running_since(record: str, since: float) -> bool:
    status = json.loads(record)
    return status["status"] == "running" and status["time"] >= since


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _confirm_generator_kills(kills: list[Kill], records: list[dict[str, Any]]) -> None:
    """A generator kill inside a negatives job landed while the generator wrote that step's negatives only if the job
    then waited for the restarted generator (WAITED_S): else the job had its answer before the kill."""
    by_step = {r["step"]: r for r in records}
    for kill in kills:
        if kill.target == "generator" and kill.inside and kill.inside.startswith("negatives:"):
            took = by_step.get(int(kill.inside.split(":")[1]), {}).get("time/negatives", 0.0)
            if took < WAITED_S:
                kill.inside = None


def reward_versions_problems(lines: list[dict[str, Any]], behind: int = 0) -> list[str]:
    """Every reward update applied at most once, and scoring on the version it must: step t is scored by the version
    step t-1-k's update left (run.reward_max_staleness k; v_0 = 0 before any), and its update gives one more than
    the version before it, or the same when it was skipped, which an update with pairs never is (one without pairs is
    skipped, unless replayed pairs make it one)."""
    problems, after_step = [], []
    for r in lines:
        t, used, after = r["step"], r.get("reward_version_used"), r.get("reward_version")
        expected = after_step[t - 1 - behind] if t - 1 - behind >= 0 else 0
        if used != expected:
            problems.append(f"step {t}: scored by reward version {used!r}, not {expected}")
        before = after_step[-1] if after_step else 0
        if not isinstance(after, int) or after - before not in ((1,) if r.get("pairs") else (0, 1)):
            problems.append(f"step {t}: reward version {after!r} after the update of version {before!r} with "
                            f"{r.get('pairs')!r} pairs")
        after_step.append(after if isinstance(after, int) else before + 1)
    return problems


def check(chaos: ChaosRun, run_dir: Path, reference: list[dict[str, Any]] | None, batch_size: int = 8,
          reference_dir: Path | None = None) -> None:
    """Append to chaos.violations every invariant the run broke; fill chaos.max_rel_diff (per numeric field).
    Without `reference` (the uninterrupted run's records) only the run's own invariants are checked; with
    `reference_dir` (the uninterrupted run's directory) its final checkpoints are compared with this run's too."""
    steps, bad = chaos.steps, chaos.violations.append
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if [r["step"] for r in lines] != list(range(steps)):
        bad(f"steps logged {[r['step'] for r in lines]}, not each of 0..{steps - 1} once in order")
    behind = chaos.max_staleness  # rollout(t) samples version max(0, t - run.max_staleness)
    wanted = {"policy_version": range(1, steps + 1),
              "policy_version_sampled": [max(0, t - behind) for t in range(steps)],
              "data_offset": range(0, batch_size * steps, batch_size)}
    for key, values in wanted.items():
        if [r.get(key) for r in lines] != list(values):
            bad(f"{key} is {[r.get(key) for r in lines]}, not {list(values)}")
    for problem in reward_versions_problems(lines, chaos.reward_max_staleness):
        bad(problem)
    if reference is None:
        return
    if len(lines) != len(reference):
        bad(f"{len(lines)} steps logged, the uninterrupted run {len(reference)}")
    for mine, calm in zip(lines, reference, strict=False):
        for key, value in calm.items():
            if key.startswith("time/") or key == "mode":
                continue
            other = mine.get(key)
            if key in EXACT or not isinstance(value, float):
                if other != value:
                    bad(f"step {calm['step']}: {key} is {other!r}, the uninterrupted run's {value!r}")
                continue
            # A field missing (or not a number) in this run is a broken invariant, not a crash of the check.
            if not isinstance(other, (int, float)) or isinstance(other, bool):
                chaos.max_rel_diff[key] = math.inf
                bad(f"step {calm['step']}: {key} is {other!r}, the uninterrupted run's {value!r}")
                continue
            chaos.max_rel_diff[key] = max(chaos.max_rel_diff.get(key, 0.0), abs(other - value) / max(abs(value), 1e-6))
            if not math.isclose(other, value, rel_tol=REL_TOL, abs_tol=1e-6):
                bad(f"step {calm['step']}: {key} is {other!r}, the uninterrupted run's {value!r}")
    if reference_dir is not None:
        chaos.checkpoint_differences, chaos.checkpoint_values_compared = final_checkpoint_differences(run_dir,
                                                                                                     reference_dir)
        chaos.violations.extend(chaos.checkpoint_differences)


def final_checkpoint_differences(run_dir: Path, reference_dir: Path) -> tuple[list[str], int]:
    """How the newest policy and VerifyRM checkpoints of `run_dir` differ from those of `reference_dir`, bit for bit:
    the name (version and update count), every weight tensor, the optimizer state (moments, step counts, hyper-
    parameters) and the bookkeeping (versions, last key, the recorded results; all but the wall-clock `saved_at`, with
    the run's name in its request keys read as the other run's).
    Returns the differences and how many values were compared. The data position is the run's, not a service's: the
    metrics' data_epoch and data_offset (EXACT) hold it."""
    import torch
    from safetensors.torch import load_file

    from cooper.runtime.checkpoint import OPTIMIZER_FILE, POLICY, REWARD, latest_checkpoint

    differences: list[str] = []
    compared = 0

    def compare(mine: Any, theirs: Any, where: str) -> None:
        nonlocal compared
        if len(differences) >= 20:
            return
        if isinstance(theirs, torch.Tensor):
            compared += 1
            same = (isinstance(mine, torch.Tensor) and mine.dtype == theirs.dtype and mine.shape == theirs.shape
                    and torch.equal(mine.contiguous().view(-1).view(torch.uint8),
                                    theirs.contiguous().view(-1).view(torch.uint8)))
            if not same:
                differences.append(f"{where}: not bit for bit the uninterrupted run's tensor")
        elif isinstance(theirs, dict):
            if not isinstance(mine, dict) or set(mine) != set(theirs):
                differences.append(f"{where}: keys {sorted(map(str, mine)) if isinstance(mine, dict) else mine!r}, "
                                   f"the uninterrupted run's {sorted(map(str, theirs))}")
                return
            for key in theirs:
                compare(mine[key], theirs[key], f"{where}.{key}")
        elif isinstance(theirs, (list, tuple)):
            if not isinstance(mine, (list, tuple)) or len(mine) != len(theirs):
                differences.append(f"{where}: {mine!r}, the uninterrupted run's {theirs!r}")
                return
            for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
                compare(a, b, f"{where}[{i}]")
        else:
            compared += 1
            if type(mine) is not type(theirs) or (mine != theirs and not (mine != mine and theirs != theirs)):
                differences.append(f"{where}: {mine!r}, the uninterrupted run's {theirs!r}")

    for service, layout in (("policy", POLICY), ("reward", REWARD)):
        mine = latest_checkpoint(run_dir / "checkpoints" / service, layout)
        theirs = latest_checkpoint(reference_dir / "checkpoints" / service, layout)
        if mine is None or theirs is None:
            differences.append(f"{service}: no final checkpoint (this run {mine}, the uninterrupted run {theirs})")
            continue
        if mine.name != theirs.name:
            differences.append(f"{service}: final checkpoint {mine.name}, the uninterrupted run's {theirs.name}")
        weight_files = sorted(p.name for p in theirs.glob("*.safetensors"))
        compare(sorted(p.name for p in mine.glob("*.safetensors")), weight_files, f"{service} weight files")
        for name in weight_files:
            if (mine / name).is_file():
                compare(load_file(mine / name), load_file(theirs / name), f"{service} {name}")
        compare(torch.load(mine / OPTIMIZER_FILE, weights_only=True),
                torch.load(theirs / OPTIMIZER_FILE, weights_only=True), f"{service} optimizer")
        # Request keys carry the run's name ("<run>/<step>"): the same keys under the other run's name.
        renamed = (path.joinpath(layout.state_file).read_text().replace(f'"{run_dir.name}/', f'"{reference_dir.name}/')
                   for path in (mine, theirs))
        bookkeeping = [{k: v for k, v in json.loads(text).items() if k != "saved_at"} for text in renamed]
        compare(*bookkeeping, f"{service} {layout.state_file}")
    return differences, compared

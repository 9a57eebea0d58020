"""`cooper train`: prepare the run directory, start what is missing (Redis, services), run, report.

Local services get free ports and checkpoints under the run directory, so that a killed run resumes exactly
(`cooper train --resume RUN`): the policy and the reward service journal every update between their periodic
checkpoints (`journal`, `save_every`; cooper/runtime/durability.py), with the same defaults as under compose and
Kubernetes. With addresses in the config nothing is started.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

import redis
import yaml

from cooper.config import CooperConfig, load_config, to_yaml, with_overrides
from cooper.launcher.embedded_redis import EmbeddedRedis
from cooper.launcher.local import LocalServices, close_redis, open_redis, services_needed
from cooper.modes import reward_mode

log = logging.getLogger("cooper.orchestrator")

RESOLVED = "config.resolved.yaml"  # secrets included, mode 600: what the services are started with
READABLE = "config.yaml"  # secrets masked: what people read


def local_overrides(config: CooperConfig, run_dir: Path) -> list[str]:
    """Free ports and run-local checkpoints for every service this run starts."""
    out = []
    for name in services_needed(config):
        if getattr(config, name).server.address:
            continue
        out += [f"{name}.server.host=127.0.0.1", f"{name}.server.port=0", f"{name}.server.metrics_port=0"]
        if name in ("policy", "reward"):
            out += [f"{name}.checkpoint_dir={run_dir / 'checkpoints' / name}"]
        if name == "reward":
            out += ["reward.http.port=0"]
    return out


def revealed(config: CooperConfig) -> dict[str, Any]:
    """The config as plain data with its secrets in clear (for files only the run's own processes read)."""

    def reveal(node):  # type: ignore[no-untyped-def]
        if isinstance(node, dict):
            return {k: reveal(v) for k, v in node.items()}
        if isinstance(node, (list, tuple)):
            return [reveal(v) for v in node]
        return node.get_secret_value() if hasattr(node, "get_secret_value") else node

    return reveal(config.model_dump(mode="python"))


def write_configs(config: CooperConfig, run_dir: Path) -> Path:
    resolved = run_dir / RESOLVED
    resolved.write_text(yaml.safe_dump(revealed(config), sort_keys=False))
    os.chmod(resolved, 0o600)
    (run_dir / READABLE).write_text(to_yaml(config))
    return resolved


def existing_run(config: CooperConfig) -> str | None:
    """The directory of the run named by run.name, if it was started before (for --resume-existing)."""
    if config.run.name and (Path(config.run.output_dir) / config.run.name / RESOLVED).is_file():
        return str(Path(config.run.output_dir) / config.run.name)
    return None


def prepare_run(config: CooperConfig, resume: str | None) -> tuple[CooperConfig, str, Path, Path]:
    """(config, run id, run dir, resolved config path) for a new run, or for the run being resumed: then `resume`
    is its directory or its name under config.run.output_dir, and its own saved config replaces `config`.

    The run directory comes back absolute: its paths are handed to other processes (Redis changes into its
    `--dir` before it binds its socket, services start elsewhere), where a relative path means something else."""
    if resume:
        run_dir = (Path(resume) if Path(resume).is_dir() else Path(config.run.output_dir) / resume).resolve()
        resolved = run_dir / RESOLVED
        if not resolved.is_file():
            raise FileNotFoundError(f"cannot resume {resume}: {resolved} not found (is it a run directory?)")
        config = load_config(resolved, environ={})
        return config, run_dir.name, run_dir, resolved
    run_id = config.run.name or f"{config.run.mode}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir = (Path(config.run.output_dir) / run_id).resolve()
    if (run_dir / RESOLVED).exists():
        raise FileExistsError(f"run directory {run_dir} exists; resume it with --resume {run_id} or pick run.name")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = with_overrides(config, [f"run.name={run_id}", *local_overrides(config, run_dir)])
    return config, run_id, run_dir, write_configs(config, run_dir)


def prepare_models(config: CooperConfig, reward: bool | None = None) -> None:
    """Build (or convert) the registered models here, before services start, so their start-up waits on nothing (the reward
    model too when `reward`, by default when the mode uses one). A service at an address (compose, Kubernetes)
    builds its own, in its own cache: doing it here too cost every orchestrator start a minute or more of CPU
    for models nothing here reads."""
    from cooper.runtime.models import builds_locally, resolve_model

    wanted = [(config.policy.model, "causal")] if not config.policy.server.address else []
    uses_reward_model = reward_mode(config.run.mode).reward_model_scores
    if (reward or (reward is None and uses_reward_model)) and not config.reward.server.address:
        wanted.append((config.reward.model, "reward"))
    for name, kind in wanted:
        if builds_locally(name):
            log.info("preparing model %s (shipped with the package, or built or converted once and cached)", name)
            resolve_model(name, kind)


def redis_lost(client: redis.Redis, err: redis.ConnectionError) -> str:
    """Why the run lost Redis: its embedded server died, or the connection to redis.url failed."""
    if isinstance(client, EmbeddedRedis) and client.server.poll() is not None:
        return (f"the embedded Redis died (exit code {client.server.returncode}; its log: {client.log_path}; its "
                f"append-only file holds the run's state)")
    return f"the run lost its connection to Redis ({err})"


def steps_in_process(config: CooperConfig, steps: int = 1) -> list[dict[str, Any]]:
    """The first `steps` steps of a run of `config` (with its initial evaluation, when it has one), all in this
    process: the stage functions one after another on this thread (`worker.run_step_inline`) over the services'
    cores (`services.InProcessServices`), an embedded Redis and the checkpoints in a temporary directory. Returns
    each step's record as metrics.jsonl would hold it. For a debugger's breakpoint in any stage or service core:

        python -c "from cooper.config import load_config, preset_path; from cooper.launcher.launch import \
            steps_in_process; print(steps_in_process(load_config(preset_path('tiny')), 1))"

    From a script, call it under `if __name__ == "__main__":`: the verifier's worker processes start from a fork
    server, which imports the script's module again (Python's rule for multiprocessing)."""
    import tempfile

    from cooper.orchestrator.data import StepData, load_data
    from cooper.orchestrator.graph import StepGraph
    from cooper.orchestrator.run import step_record
    from cooper.orchestrator.run_store import RunStore
    from cooper.orchestrator.services import InProcessServices
    from cooper.orchestrator.stages import StageContext
    from cooper.orchestrator.worker import run_step_inline

    if config.run.reward_max_staleness and reward_mode(config.run.mode).reward_model_learns:
        raise ValueError("steps_in_process runs one step after another; with run.reward_max_staleness > 0 a step's "
                         "reward update waits for a later step's scores: run it with `cooper train`")
    with tempfile.TemporaryDirectory(prefix="cooper-steps-") as scratch:
        config = with_overrides(config, [f"policy.checkpoint_dir={scratch}/policy",
                                         f"reward.checkpoint_dir={scratch}/reward", "redis.url=null"])
        rows, tests = load_data(config)
        graph = StepGraph(config.run.mode, config.run.steps, config.eval.every)
        client = open_redis(config, Path(scratch))
        store = RunStore(client, config.redis.key_prefix, "in-process")
        store.begin("in-process", steps)
        ctx = StageContext(config, "in-process", store, StepData(rows, config.run.batch_size, config.run.seed), tests,
                           InProcessServices(config))
        try:
            for step in range(graph.first_step(), steps):
                run_step_inline(ctx, graph, step)
            return [step_record(ctx, graph, step).metrics for step in range(steps)]
        finally:
            ctx.close()
            close_redis(client)


def train(config: CooperConfig, resume: str | None = None, progress: bool = True, workers: int = 3,
          in_process: bool = False) -> Path:
    """Run (or resume) one training run; returns its directory.

    Start-up runs side by side: the services start at once (local.py), right after the embedded Redis has the run
    directory's lock (which keeps a second `cooper train --resume` of a run that still goes from starting services
    on its checkpoints); this process imports the orchestrator's own modules while they load. `in_process`: no
    service processes; the stages call the services' cores in this process (orchestrator/services.py), with the
    same checkpoints and journals under the run directory, so a run can be resumed either way."""
    from cooper.orchestrator.trackers import Tracker, each_tracker, open_trackers, require_packages

    require_packages(config)
    config, run_id, run_dir, resolved = prepare_run(config, resume)
    prepare_models(config)
    client = open_redis(config, run_dir)
    local = None if in_process else LocalServices(config, resolved, run_dir)
    interrupted, completed = False, False
    trackers: list[Tracker] = []
    try:
        if local is not None:
            local.spawn()
        from cooper.orchestrator.run import Orchestrator
        from cooper.orchestrator.run_store import RunStore
        from cooper.orchestrator.services import InProcessServices, RemoteServices

        trackers = open_trackers(config, run_id, run_dir)  # while the services load
        store = RunStore(client, config.redis.key_prefix, run_id)
        if local is None:
            Orchestrator(config, run_id, run_dir, store, InProcessServices(config), workers=workers,
                         trackers=trackers).run(resume=resume is not None, progress=progress)
        else:
            # A service that dies and cannot be restarted stops the run at once, with why, instead of after every
            # client's unavailable_timeout_s.
            local.on_lost = store.fail_run
            with local:
                Orchestrator(config, run_id, run_dir, store, RemoteServices(config, local.addresses),
                             workers=workers, trackers=trackers).run(resume=resume is not None, progress=progress)
        completed = True
    except redis.ConnectionError as err:
        from cooper.orchestrator.run import RunFailed

        raise RunFailed(f"{redis_lost(client, err)}; the run stopped, its state kept. Continue it with: "
                        f"cooper train --resume {run_id}") from None
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:  # on every exit: Ctrl-C, a failed run, an error; services are stopped first
        if local is not None:
            local.stop()
        close_redis(client)
        if not completed:  # the tracked runs stay open for --resume
            each_tracker(trackers, "close")
        if interrupted:
            log.warning("interrupted; everything the run started is stopped and its state is kept. Continue it "
                        "with: cooper train --resume %s", run_id)
    from cooper.launcher.plot import plot
    from cooper.orchestrator.outputs import read_metrics, stage_time_table, summary_table

    records = read_metrics(run_dir)
    figure = plot(records, run_dir / "plot.png", title=f"{config.run.mode} · {run_id}")
    each_tracker(trackers, "finish", [figure])
    print(summary_table(records))
    if stage_times := stage_time_table(records):
        print("\n" + stage_times)
    print(f"\nrun directory: {run_dir}  (metrics.jsonl, plot.png, checkpoints/, ...: docs/training.md, "
          '"What a run writes")')
    return run_dir

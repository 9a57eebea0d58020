"""Weights & Biases and MLflow beside metrics.jsonl (`run.loggers`).

metrics.jsonl stays the run's record; a tracker gets a copy: the resolved config when it opens, every step's numbers
under metrics.jsonl's names and step, the alarm's raises and clears as they happen (W&B alerts, MLflow tags), and the
plots once the run has ended. The tracked run's id is kept in the run directory (trackers.json), so `cooper train
--resume` goes on in the same tracked run instead of starting another.

Neither package is needed unless a run names it: `require_packages` says what to install before anything starts.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from cooper.config import ConfigError, CooperConfig, MlflowConfig, WandbConfig
from cooper.metric_names import ELAPSED
from cooper.runtime.files import write_atomically

log = logging.getLogger("cooper.orchestrator")

IDS_FILE = "trackers.json"
"""runs/<name>/trackers.json: {"wandb": id, "mlflow": run id}, the tracked runs a resumed run goes on in."""

DEFAULT_PROJECT = "cooper"
"""W&B project and MLflow experiment when neither the config nor the tool's environment variable names one."""

DATABASE_MODULES = ("sqlalchemy", "alembic")
"""What MLflow's database stores (sqlite:///..., the default here) import besides mlflow: the `mlflow` package has
them, `mlflow-skinny` does not."""


class Tracker(Protocol):
    def log(self, step: int, numbers: Mapping[str, float]) -> None: ...

    def missing(self, steps: Sequence[int]) -> list[int]:
        """Of a resumed run's logged steps, the ones this tracked run may not hold: a kill can cut off what a
        tracker had not yet stored, and the resumed run logs only the steps after the last one logged."""

    def alarm(self, event: Mapping[str, Any]) -> None: ...

    def finish(self, files: Sequence[Path]) -> None:
        """The run completed: attach `files` (the plots) and mark the tracked run finished."""

    def close(self) -> None:
        """The run stopped without completing (an error, Ctrl-C): the tracked run stays open for --resume."""


def each_tracker(trackers: Sequence[Tracker], method: str, *args: Any) -> None:
    """Call `method` on every tracker; one that fails (a tracking server down, a full disk) is logged and the run
    goes on: metrics.jsonl holds everything it missed."""
    for tracker in trackers:
        try:
            getattr(tracker, method)(*args)
        except Exception as err:  # noqa: BLE001 (any tracker error: the run is worth more than its copy)
            log.warning("%s: %s failed (%s: %s); metrics.jsonl has everything", type(tracker).__name__, method,
                        type(err).__name__, err)


def require_packages(config: CooperConfig) -> None:
    """A clear error, before the run starts anything, for a tracker whose package is not installed."""
    needed: dict[str, str] = {}  # module -> why
    if "wandb" in config.run.loggers:
        needed["wandb"] = "run.loggers names wandb"
    if "mlflow" in config.run.loggers:
        needed["mlflow"] = "run.loggers names mlflow"
        uri = mlflow_uri(config.run.mlflow, Path("runs"))
        if not uri.startswith(("http:", "https:", "file:", "databricks")):
            needed.update({module: f"MLflow's store {uri.split(':')[0]}:" for module in DATABASE_MODULES})
    missing = [module for module in needed if importlib.util.find_spec(module) is None]
    if missing:
        raise ConfigError(f"{needed[missing[0]]}, but {', '.join(missing)} is not installed: pip install "
                          f"{' '.join(missing)} (the tested versions are in requirements/dev.txt; mlflow-skinny "
                          "needs sqlalchemy and alembic beside it for a database store)")


def mlflow_uri(settings: MlflowConfig, run_dir: Path) -> str:
    """run.mlflow.tracking_uri, else MLFLOW_TRACKING_URI, else a SQLite database in the run directory."""
    return (settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
            or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}")


def open_trackers(config: CooperConfig, run_id: str, run_dir: Path) -> list[Tracker]:
    """The run's trackers, each continuing the tracked run a previous start of this run opened."""
    ids_path = run_dir / IDS_FILE
    ids: dict[str, str] = json.loads(ids_path.read_text()) if ids_path.exists() else {}
    settings = config.model_dump(mode="json")  # secrets come out masked
    trackers: list[Tracker] = []
    for name in config.run.loggers:
        if name == "wandb":
            wandb = WandbTracker(config.run.wandb, run_id, run_dir, settings, ids.get(name))
            ids[name] = wandb.id
            trackers.append(wandb)
        elif name == "mlflow":
            mlflow = MlflowTracker(config.run.mlflow, run_id, run_dir, settings, ids.get(name))
            ids[name] = mlflow.id
            trackers.append(mlflow)
        write_atomically(ids_path, json.dumps(ids, indent=2))
    return trackers


def _alarm_title(event: Mapping[str, Any]) -> str:
    return f"reward-hacking alarm {event['event']} at step {event['step']}"


class WandbTracker:
    """One W&B run per Cooper run, resumed by id; offline mode writes it under runs/<name>/wandb/."""

    def __init__(self, settings: WandbConfig, run_id: str, run_dir: Path, config: dict[str, Any],
                 tracked_id: str | None):
        import wandb

        self._wandb = wandb
        # unique in the project, named after the run (W&B ids take letters, digits, - and _)
        self.id = tracked_id or f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_id)}-{secrets.token_hex(4)}"
        self.run = wandb.init(
            project=settings.project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, entity=settings.entity,
            mode=settings.mode, id=self.id, resume="allow", name=run_id, dir=str(run_dir), config=config,
            reinit="create_new", settings=wandb.Settings(console="off"))  # the run's console has its own log
        self._last_step = 0

    def missing(self, steps: Sequence[int]) -> list[int]:
        # A resumed online run starts at the step after the last one W&B stored (it drops lower ones); an offline
        # run's new directory starts at 0 and `wandb sync` drops what the tracked run already holds.
        return [step for step in steps if step >= self.run.starting_step]

    def log(self, step: int, numbers: Mapping[str, float]) -> None:
        # W&B keeps steps increasing: a step a resumed run logs again (it had been written before the kill) is
        # dropped with a warning, and holds the same numbers.
        self.run.log(dict(numbers), step=step)
        self._last_step = step

    def alarm(self, event: Mapping[str, Any]) -> None:
        level = "WARN" if event["event"] == "raised" else "INFO"
        self.run.alert(title=_alarm_title(event), text=json.dumps(event), level=level, wait_duration=0)

    def finish(self, files: Sequence[Path]) -> None:
        images = {f"plots/{path.stem}": self._wandb.Image(str(path)) for path in files if path.exists()}
        if images:
            self.run.log(images, step=self._last_step)
        self.run.finish()

    def close(self) -> None:
        self.run.finish(exit_code=1)


class MlflowTracker:
    """One MLflow run per Cooper run, in the experiment named by run.mlflow; resumed by its run id."""

    def __init__(self, settings: MlflowConfig, run_id: str, run_dir: Path, config: dict[str, Any],
                 tracked_id: str | None):
        from mlflow import MlflowClient

        in_run_dir = not (settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI"))
        self.client = MlflowClient(tracking_uri=mlflow_uri(settings, run_dir))
        if tracked_id:
            self.id = tracked_id
            self.client.update_run(tracked_id, status="RUNNING")
            return
        name = settings.experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        experiment = self.client.get_experiment_by_name(name)
        # The run directory's own database keeps its artifacts beside it (MLflow's default is ./mlruns, wherever
        # the run was started from).
        artifacts = (run_dir / "mlflow-artifacts").resolve().as_uri() if in_run_dir else None
        experiment_id = (experiment.experiment_id if experiment
                         else self.client.create_experiment(name, artifact_location=artifacts))
        run = self.client.create_run(experiment_id, run_name=run_id, tags={"cooper.mode": config["run"]["mode"]})
        self.id = run.info.run_id
        self.client.log_dict(self.id, config, "config.json")
        from mlflow.entities import Param

        params = [Param(key, str(value)) for key, value in _flat(config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 params a call
            self.client.log_batch(self.id, params=params[start:start + 100])

    def missing(self, steps: Sequence[int]) -> list[int]:
        # log_batch returns once the store has the step; a kill loses at most the step under way. Every step's
        # record has ELAPSED.
        stored = {metric.step for metric in self.client.get_metric_history(self.id, ELAPSED)}
        return [step for step in steps if step not in stored]

    def log(self, step: int, numbers: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in numbers.items()]
        for start in range(0, len(metrics), 1000):  # MLflow takes at most 1,000 metrics a call
            self.client.log_batch(self.id, metrics=metrics[start:start + 1000])

    def alarm(self, event: Mapping[str, Any]) -> None:
        self.client.set_tag(self.id, f"alarm.step-{event['step']}.{event['event']}", json.dumps(event))

    def finish(self, files: Sequence[Path]) -> None:
        for path in files:
            if path.exists():
                self.client.log_artifact(self.id, str(path))
        self.client.set_terminated(self.id, "FINISHED")

    def close(self) -> None:
        self.client.set_terminated(self.id, "KILLED")


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"run": {"seed": 0}} -> {"run.seed": 0}: the config as MLflow params (values of at most 6,000 characters)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = json.dumps(value)[:6000] if not isinstance(value, str) else value[:6000]
    return out

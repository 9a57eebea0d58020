"""A read replica follows the trainer: it polls the trainer's checkpoint directory and swaps in each newer version.

Why poll the directory rather than watch the trainer's `GET /v1/model`: the replica has to read the weights from
the shared volume anyway, so the directory is the one thing it cannot do without, while the trainer's API is one
more dependency (its address, its bearer token, a NetworkPolicy hole from every replica to it) that would tell it
nothing the directory does not. A listing every `reward.replica.poll_s` costs a few stat calls, and a replica keeps
serving, and can start, while the trainer restarts. A checkpoint is complete once its directory has its final name
(checkpoint.py renames it into place, state file written last), so a listing never shows a half-written one.

Staleness. `lag_s` counts from the moment this replica first saw a checkpoint newer than the one it serves (its own
monotonic clock, not file times, which come from another machine's clock on a network volume), so it is short of
the true lag by at most one poll; while the directory cannot be listed it counts from the last listing that
worked. `versions_behind` is the newest complete version on the volume minus the served one. Past
`reward.replica.max_lag_s` or `max_versions_behind` the replica is stale, and `on_stale` says what it does
(config.ReplicaConfig). A checkpoint that fails to load (corrupt, deleted by the trainer's `keep_checkpoints`
mid-read) is retried after ten polls, or as soon as a newer one appears; the model keeps serving what it had.

Left out: following a trainer whose versions go back (a wiped volume): a replica only ever moves forward; restart
it to follow a new run.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import prometheus_client

from cooper.config import ReplicaConfig
from cooper.runtime import checkpoint
from cooper.runtime.checkpoint import REWARD

log = logging.getLogger("cooper.reward")

LAG_SECONDS = prometheus_client.Gauge(
    "cooper_reward_replica_lag_seconds", "Seconds a newer trainer checkpoint has waited to be loaded (0: current)")
VERSIONS_BEHIND = prometheus_client.Gauge(
    "cooper_reward_replica_versions_behind", "Newest checkpoint version on the volume minus the served version")
TRAINER_VERSION = prometheus_client.Gauge(
    "cooper_reward_replica_trainer_version", "Newest complete checkpoint version seen in the trainer's directory")
STALE = prometheus_client.Gauge("cooper_reward_replica_stale", "1 while past reward.replica's lag limits, else 0")
LOADS = prometheus_client.Counter("cooper_reward_replica_loads_total", "Checkpoint loads by a replica", ["outcome"])

RETRY_FAILED_AFTER_POLLS = 10


class ReplicaStale(Exception):
    """A replica past its lag limit with reward.replica.on_stale=refuse; retry in `retry_after_s` (elsewhere)."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class ReadOnlyReplica(Exception):
    """Update or Save sent to a read replica."""


@dataclass(frozen=True)
class Staleness:
    served_version: int
    trainer_version: int  # newest complete checkpoint seen; the served version when none is newer
    lag_s: float
    stale: bool

    @property
    def versions_behind(self) -> int:
        return max(0, self.trainer_version - self.served_version)

    def describe(self) -> str:
        return (f"serving version {self.served_version}, {self.versions_behind} behind the trainer's "
                f"{self.trainer_version}, lag {self.lag_s:.1f} s")


def judge(config: ReplicaConfig, served_version: int, trainer_version: int, behind_since: float | None,
          listed_at: float, now: float) -> Staleness:
    """The replica's staleness at `now` (monotonic seconds): `behind_since` is when it first saw a newer checkpoint
    (None: it serves the newest), `listed_at` when the directory was last listed successfully."""
    lag = max(0.0, now - behind_since) if behind_since is not None else 0.0
    lag = max(lag, now - listed_at - config.poll_s)  # a listing is due every poll_s; missing ones add up
    behind = trainer_version - served_version
    stale = (config.max_lag_s is not None and lag > config.max_lag_s) or \
        (config.max_versions_behind is not None and behind > config.max_versions_behind)
    return Staleness(served_version, max(trainer_version, served_version), lag, stale)


def newest_checkpoint(root: str) -> tuple[int, Path] | None:
    """(version, path) of the newest complete checkpoint under root, None before the trainer's first save (no
    directory yet); OSError when root cannot be listed."""
    latest = checkpoint.latest_checkpoint(root, REWARD)
    return None if latest is None else (checkpoint.read_state(latest, REWARD)["version"], latest)


class ReplicaFollower:
    """Polls `root` every config.poll_s and calls `load(path)` for each newer checkpoint; `staleness()` any time.

    `served_version()` is the version the service answers with; `on_change(staleness)` is called after every poll
    (the service updates its health and metrics there).
    """

    def __init__(self, config: ReplicaConfig, root: str, served_version: Callable[[], int],
                 load: Callable[[str], Awaitable[object]], on_change: Callable[[Staleness], None] | None = None):
        self.config = config
        self.root = root
        self.served_version = served_version
        self.load = load
        self.on_change = on_change
        self.trainer_version = served_version()
        self.behind_since: float | None = None
        self.listed_at = time.monotonic()
        self._failed: dict[str, float] = {}  # checkpoint path -> when its load failed
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="reward-replica-follower")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def staleness(self, now: float | None = None) -> Staleness:
        return judge(self.config, self.served_version(), self.trainer_version, self.behind_since, self.listed_at,
                     time.monotonic() if now is None else now)

    @property
    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.config.poll_s))

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception:  # never let one bad poll end the follower; the next one tries again
                log.exception("replica: poll of %s failed", self.root)
            await asyncio.sleep(self.config.poll_s)

    async def poll(self) -> Staleness:
        """List the directory once, load a newer checkpoint if there is one; the staleness after it."""
        try:
            newest = await asyncio.to_thread(newest_checkpoint, self.root)
            self.listed_at = time.monotonic()
        except (OSError, ValueError, KeyError) as err:  # unreadable volume, a state file torn by a crash
            log.warning("replica: cannot list %s: %s", self.root, err)
            newest = None
        if newest is not None:
            await self._follow(*newest)
        staleness = self.staleness()
        self._publish(staleness)
        return staleness

    async def _follow(self, version: int, path: Path) -> None:
        self.trainer_version = max(self.trainer_version, version)
        if version <= self.served_version():
            self.behind_since = None
            return
        now = time.monotonic()
        if self.behind_since is None:
            self.behind_since = now
        failed_at = self._failed.get(str(path))
        if failed_at is not None and now - failed_at < RETRY_FAILED_AFTER_POLLS * self.config.poll_s:
            return
        try:
            await self.load(str(path))
        except Exception as err:
            self._failed = {str(path): now}  # only the newest matters; older failures are moot
            LOADS.labels("failed").inc()
            log.warning("replica: cannot load %s (version %d): %s; still %s", path, version, err,
                        self.staleness().describe())
            return
        self._failed.clear()
        LOADS.labels("loaded").inc()
        if self.served_version() >= self.trainer_version:
            self.behind_since = None

    def _publish(self, staleness: Staleness) -> None:
        LAG_SECONDS.set(staleness.lag_s)
        VERSIONS_BEHIND.set(staleness.versions_behind)
        TRAINER_VERSION.set(staleness.trainer_version)
        STALE.set(int(staleness.stale))
        if self.on_change is not None:
            self.on_change(staleness)

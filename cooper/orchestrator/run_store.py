"""The run's jobs and state in Redis: a stream with a consumer group, job statuses, results, run state.

Every key of a run lives under `<prefix>:<run_id>:`, so runs (and tests) never share keys. The pattern is the
standard one for Redis streams: XADD to enqueue, XREADGROUP to take, XACK after the result is recorded, and
XAUTOCLAIM to take over the pending jobs of a worker that died. Enqueueing is guarded by SET NX, so two workers
that finish the two inputs of one job at the same moment enqueue it once; the guard, the status and the XADD are one
Lua script, so a process killed in the middle cannot leave a job marked enqueued that is on no queue (a resume would
then skip it for good, and the run would wait forever: seen once in CI's SIGKILL test).
"""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from typing import Any

import redis

GROUP = "workers"

# KEYS: the enqueued flag, the status hash, the stream; ARGV: job id, status record. 1 if enqueued, 0 if it was before.
# A script runs whole, with nothing between its commands, and reaches the append-only file as one block; the flag is
# set last, so a command that fails (Redis does not roll a script back) leaves the job not enqueued, to be retried.
_ENQUEUE_ONCE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('XADD', KEYS[3], '*', 'job', ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SET', KEYS[1], 1)
return 1
"""


class JobStatus(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass(frozen=True)
class Logged:
    """Where the run stands, as the driver writes it down when it logs a step (run.py): where a resumed run starts
    (the step after `through`, the data after `data_offset`) and the versions it should find the services at."""

    through: int = -1
    """The last step logged; -1 before the first."""
    policy_version: int | None = None
    """The policy version after step `through`'s update."""
    reward_version: int | None = None
    """VerifyRM's version after step `through` (its update's, or the one that scored it where none updates)."""
    data_epoch: int | None = None
    data_offset: int | None = None
    """Where step `through` ended in the training data."""


@dataclass(frozen=True)
class RollbackRequest:
    """The alarm's rollback of one raise: restore the newest kept policy checkpoint at or below `at_most_version`."""

    raise_number: int
    at_most_version: int


@dataclass(frozen=True)
class AlarmOrders:
    """What the reward-hacking alarm asks of the stages now (alarm_watch.py writes it, in act mode only)."""

    in_force: tuple[str, ...] = ()
    """The actions in force, in the order they came into force (alarm.actions)."""
    rollback: RollbackRequest | None = None
    """The latest raise's rollback request (taken once: `rollback_done`)."""
    rollback_done: int = 0
    """The raise whose rollback policy_update took last."""

    @property
    def verifier_reward(self) -> bool:
        """The policy trains on the verifier's reward instead of VerifyRM's."""
        return "verifier_reward" in self.in_force

    @property
    def rm_negatives(self) -> bool:
        """VerifyRM's update takes more optimizer steps, with the rollouts it overpaid as extra negatives."""
        return "rm_negatives" in self.in_force


@dataclass(frozen=True)
class AlarmMemory:
    """What the driver's alarm keeps across a resume: the detector's state and where its actions stand."""

    detector: dict[str, Any] | None = None
    """The detector's own state (evaluation/alarm.py, `state_dict`); None before the first step it saw."""
    latched: bool = False
    """With alarm.latch: it has raised once, so its actions stay in force."""
    raises: int = 0
    raised_step: int = 0
    """The raises so far and the step of the latest."""
    onset: dict[str, int] | None = None
    """The newest step with every statistic at 0, and the policy version that sampled it."""
    level: int = 0
    """How many of the actions, in order, are in force."""
    rolled_back: int = 0
    """The raise whose rollback was requested last."""


_ALARM = "alarm"
_ALARM_LATCHED = "alarm_latched"
_ALARM_ACTING = "alarm_acting"
_ALARM_ACTIVE = "alarm_active"
_ROLLBACK = "rollback_request"
_ROLLBACK_DONE = "rollback_done"


class RunState:
    """The run's state, a flat map of JSON values, read and written only through the typed methods here (what the
    driver has logged, the alarm's orders and memory). `RunStore` keeps it in Redis; a replay of the alarm over
    recorded runs keeps it in a dict (bench/alarm_replay.py)."""

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def set_state(self, **values: Any) -> None:
        raise NotImplementedError

    def begin(self, run_id: str, steps: int) -> None:
        """A new run's state: nothing logged yet."""
        self.set_state(run_id=run_id, steps=steps, logged_through=-1)

    def logged(self) -> Logged:
        state = self.state()
        return Logged(int(state.get("logged_through", -1)), state.get("policy_version"), state.get("reward_version"),
                      state.get("data_epoch"), state.get("data_offset"))

    def set_logged(self, logged: Logged) -> None:
        self.set_state(logged_through=logged.through, policy_version=logged.policy_version,
                       reward_version=logged.reward_version, data_epoch=logged.data_epoch,
                       data_offset=logged.data_offset)

    def alarm_orders(self) -> AlarmOrders:
        """The alarm's orders to the stages, as its watch last wrote them (none before it acted)."""
        state = self.state()
        request = state.get(_ROLLBACK)
        return AlarmOrders(tuple(state.get(_ALARM_ACTIVE, [])),
                           RollbackRequest(request["raise"], request["at_most_version"]) if request else None,
                           int(state.get(_ROLLBACK_DONE, 0)))

    def rollback_taken(self, request: RollbackRequest) -> None:
        """policy_update took `request`: no later step takes it again."""
        self.set_state(**{_ROLLBACK_DONE: request.raise_number})

    def alarm_memory(self) -> AlarmMemory:
        state = self.state()
        acting = state.get(_ALARM_ACTING, {})
        return AlarmMemory(state.get(_ALARM), bool(state.get(_ALARM_LATCHED)), int(acting.get("raises", 0)),
                           int(acting.get("raised_step", 0)), acting.get("onset") or None, int(acting.get("level", 0)),
                           int(acting.get("rolled_back", 0)))

    def set_alarm(self, memory: AlarmMemory, in_force: list[str] | None = None,
                  rollback: RollbackRequest | None = None) -> None:
        """One step's alarm, in one write: its memory, and in act mode the actions in force (`in_force`) and a new
        rollback request."""
        state: dict[str, Any] = {_ALARM: memory.detector, _ALARM_ACTING: {
            "raises": memory.raises, "raised_step": memory.raised_step, "onset": memory.onset or {},
            "level": memory.level, "rolled_back": memory.rolled_back}}
        if memory.latched:
            state[_ALARM_LATCHED] = True
        if in_force is not None:
            state[_ALARM_ACTIVE] = in_force
        if rollback is not None:
            state[_ROLLBACK] = {"raise": rollback.raise_number, "at_most_version": rollback.at_most_version}
        self.set_state(**state)

    def error(self) -> str | None:
        """The failure that stopped the run (fail_run), or None."""
        return self.state().get("error")


class RunStore(RunState):
    def __init__(self, client: redis.Redis, prefix: str, run_id: str):
        # Any: redis-py types every reply as a union of the sync and async clients' and of bytes and str; the client
        # here is synchronous and decodes (decode_responses=True), so the replies are what the methods below say.
        self.redis: Any = client
        self.base = f"{prefix}:{run_id}"
        self.stream = self.key("jobs")
        self._enqueue_once = client.register_script(_ENQUEUE_ONCE)
        try:
            self.redis.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def key(self, name: str) -> str:
        return f"{self.base}:{name}"

    # -- queue ---------------------------------------------------------------------------------------------------
    def enqueue(self, job_id: str) -> bool:
        """Put a job on the stream once; False if it was enqueued before. Atomic (_ENQUEUE_ONCE)."""
        record = json.dumps({"status": JobStatus.QUEUED.value, "time": time.time()})
        keys = [self.key(f"enqueued:{job_id}"), self.key("status"), self.stream]
        return bool(self._enqueue_once(keys=keys, args=[job_id, record]))

    def requeue(self, job_id: str) -> None:
        """Enqueue again after a failed attempt (the retry is a new stream entry)."""
        self.set_status(job_id, JobStatus.QUEUED)
        self.redis.xadd(self.stream, {"job": job_id})

    def take(self, consumer: str, block_ms: int = 200) -> tuple[str, str] | None:
        """(message id, job id) of the next new job for this consumer, or None after block_ms."""
        reply = self.redis.xreadgroup(GROUP, consumer, {self.stream: ">"}, count=1, block=block_ms)
        if not reply:
            return None
        message_id, fields = reply[0][1][0]
        return message_id, fields["job"]

    def claim_stale(self, consumer: str, min_idle_ms: int) -> list[tuple[str, str]]:
        """Take over jobs another consumer took but never acknowledged for min_idle_ms (it died)."""
        claimed: list[tuple[str, str]] = []
        start = "0-0"
        while True:
            start, messages, *_ = self.redis.xautoclaim(self.stream, GROUP, consumer, min_idle_ms, start, count=100)
            claimed += [(mid, fields["job"]) for mid, fields in messages if fields]
            if start in ("0-0", b"0-0"):
                return claimed

    def ack(self, message_id: str) -> None:
        self.redis.xack(self.stream, GROUP, message_id)

    def pending_count(self) -> int:
        return int(self.redis.xpending(self.stream, GROUP)["pending"])

    # -- job status and results ------------------------------------------------------------------------------------
    def set_status(self, job_id: str, status: JobStatus, **info: Any) -> None:
        record = {"status": status.value, "time": time.time(), **info}
        self.redis.hset(self.key("status"), job_id, json.dumps(record))

    def status(self, job_id: str) -> dict[str, Any] | None:
        raw = self.redis.hget(self.key("status"), job_id)
        return json.loads(raw) if raw else None

    def attempts(self, job_id: str) -> int:
        """Count one more attempt of the job; returns the count."""
        return int(self.redis.hincrby(self.key("attempts"), job_id, 1))

    def reset_attempts(self) -> None:
        """Every job gets its full attempts again (a resumed run)."""
        self.redis.delete(self.key("attempts"))

    def finish(self, job_id: str, result: dict[str, Any]) -> None:
        """Record the result and mark the job done, in one transaction."""
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self.key(f"result:{job_id}"), json.dumps(result))
        pipe.sadd(self.key("done"), job_id)
        pipe.hset(self.key("status"), job_id, json.dumps({"status": JobStatus.DONE.value, "time": time.time()}))
        pipe.execute()

    def result(self, job_id: str) -> dict[str, Any]:
        raw = self.redis.get(self.key(f"result:{job_id}"))
        if raw is None:
            raise KeyError(f"no result recorded for job {job_id} in {self.base}")
        return json.loads(raw)

    def delete_results(self, job_ids: list[str]) -> None:
        if job_ids:
            self.redis.delete(*[self.key(f"result:{j}") for j in job_ids])

    def done(self) -> set[str]:
        return set(self.redis.smembers(self.key("done")))

    def is_done(self, job_id: str) -> bool:
        return bool(self.redis.sismember(self.key("done"), job_id))

    # -- run state -----------------------------------------------------------------------------------------------
    def set_state(self, **values: Any) -> None:
        self.redis.hset(self.key("state"), mapping={k: json.dumps(v) for k, v in values.items()})

    def state(self) -> dict[str, Any]:
        return {k: json.loads(v) for k, v in self.redis.hgetall(self.key("state")).items()}

    def fail_run(self, message: str) -> None:
        """Mark the run failed; the driver stops with `message`. The first failure wins: later ones are its echoes."""
        self.redis.hsetnx(self.key("state"), "error", json.dumps(message))

    def clear_error(self) -> None:
        """Forget the failure that stopped the run (a resume after the cause was fixed)."""
        self.redis.hdel(self.key("state"), "error")

    def clear(self) -> None:
        """Delete every key of this run."""
        keys = list(self.redis.scan_iter(match=f"{self.base}:*", count=500))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start : start + 500])

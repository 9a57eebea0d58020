"""A stage worker: take a job, run its stage, record the result, enqueue what it unblocked, acknowledge.

Failures are retried as values: an attempt that raised is recorded with its error and put back on the queue
until `max_attempts`, then the run is marked failed with the job's error (at once for an error that says it is
not `retryable`, such as a model at the wrong version). A worker that dies leaves its job pending; another worker
(or the resumed orchestrator) claims it after `claim_idle_s` and runs it again. A job interrupted because the
worker is being stopped (Ctrl-C, the run failed elsewhere) is left pending too, not counted as a failure.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from typing import Any

import redis

from cooper.orchestrator.graph import Job, StepGraph
from cooper.orchestrator.run_store import JobStatus, RunStore
from cooper.orchestrator.stage_results import to_json
from cooper.orchestrator.stages import STAGES, StageContext

log = logging.getLogger("cooper.orchestrator.worker")


class StageWorker:
    def __init__(self, ctx: StageContext, graph: StepGraph, name: str, max_attempts: int = 3,
                 claim_idle_s: float = 900.0):
        self.ctx, self.graph, self.name = ctx, graph, name
        self.store: RunStore = ctx.store
        self.max_attempts, self.claim_idle_ms = max_attempts, int(claim_idle_s * 1000)
        self.stop_event = threading.Event()

    def run_job(self, message_id: str, job_id: str) -> None:
        job = Job.parse(job_id)
        if self.store.is_done(job_id):  # finished before a crash: only what it unblocked may be missing
            self.enqueue_unblocked(job)
            self.store.ack(message_id)
            return
        self.store.set_status(job_id, JobStatus.RUNNING, worker=self.name)
        start = time.perf_counter()
        try:
            result = STAGES[job.stage](self.ctx, job.step)
        except Exception as err:  # retry as a value; the error is recorded for the user
            if self.stop_event.is_set():  # its clients were closed under it: the resumed run takes the job again
                log.info("job %s interrupted by the stop; left for the resumed run", job_id)
                return
            attempts = self.store.attempts(job_id)
            detail = f"{type(err).__name__}: {err}"
            log.warning("job %s failed (attempt %d/%d): %s", job_id, attempts, self.max_attempts, detail)
            if attempts < self.max_attempts and getattr(err, "retryable", True):
                self.store.requeue(job_id)
            else:
                self.store.set_status(job_id, JobStatus.FAILED, error=detail, trace=traceback.format_exc()[-4000:])
                times = f" {attempts} times" if attempts > 1 else ""
                self.store.fail_run(f"job {job_id} failed{times}: {detail}")
            self.store.ack(message_id)
            return
        record_result(self.store, job_id, result, time.perf_counter() - start)
        self.enqueue_unblocked(job)
        self.store.ack(message_id)

    def enqueue_unblocked(self, job: Job) -> None:
        """Enqueue each job that waited for `job` and now has all its inputs (SET NX makes this idempotent)."""
        for nxt in self.graph.dependents(job):
            if all(self.store.is_done(d.id) for d in self.graph.dependencies(nxt)):
                self.store.enqueue(nxt.id)

    def loop(self) -> None:
        """Work until stop_event is set, or until Redis is lost: redis-py has retried by then, and the driver stops
        the run saying so (a job cut short stays pending for the resumed run)."""
        last_claim = 0.0
        try:
            while not self.stop_event.is_set():
                if time.monotonic() - last_claim > 5.0:
                    last_claim = time.monotonic()
                    for message_id, job_id in self.store.claim_stale(self.name, self.claim_idle_ms):
                        log.info("claimed stale job %s", job_id)
                        self.run_job(message_id, job_id)
                taken = self.store.take(self.name, block_ms=100)
                if taken is not None:
                    self.run_job(*taken)
        except redis.ConnectionError as err:
            log.warning("worker %s stops: Redis is lost (%s)", self.name, err)


def run_step_inline(ctx: StageContext, graph: StepGraph, step: int) -> dict[str, float]:
    """Every job of step `step` on this thread, one after another in the graph's order, each result recorded as a
    worker records it; no queue, no threads, no retries (an error is raised as it is). For benches, tests and a
    debugger stepping through one step; with `services.InProcessServices` the whole step runs in this process.
    The jobs of earlier steps it depends on must be done. Returns each stage's seconds."""
    seconds: dict[str, float] = {}
    pending = graph.jobs(step)
    while pending:
        ready = [job for job in pending if all(ctx.store.is_done(d.id) for d in graph.dependencies(job))]
        if not ready:
            raise RuntimeError(f"step {step}: {[job.id for job in pending]} wait for jobs of earlier steps that are "
                               "not done; run those steps first")
        for job in ready:
            start = time.perf_counter()
            result = STAGES[job.stage](ctx, job.step)
            seconds[job.stage] = time.perf_counter() - start
            record_result(ctx.store, job.id, result, seconds[job.stage])
            pending.remove(job)
    return seconds


def record_result(store: RunStore, job_id: str, result: Any, seconds: float) -> None:
    """A stage's result as the store keeps it: its JSON, with the job's wall time and when it ended."""
    record = to_json(result)
    record["seconds"], record["finished_at"] = seconds, time.time()
    store.finish(job_id, record)


def worker_name(index: int) -> str:
    return f"{os.uname().nodename}-{os.getpid()}-{index}"

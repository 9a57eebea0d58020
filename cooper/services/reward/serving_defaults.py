"""The serving settings the reward service chooses for itself where the config leaves them unset (None): how many
model processes (reward.model_copies), the largest batch (reward.batching.max_batch_size) and how long a request may
wait for others (reward.batching.max_wait_ms). Each choice comes with the reason the service logs at start-up.

- **Model processes** from the machine: on a CPU, one per core its torch threads (reward.torch_threads, else
  OMP_NUM_THREADS, else all cores) leave room for: a process runs one forward pass at a time, and a small model's
  pass gains little from a second thread; on a GPU one, which batches across requests itself (more serving there
  is read replicas, reward.role=replica).
- **Batch and wait** from a short calibration of the model itself at start-up (`time_forward_passes`): the smallest
  batch that reaches 0.9 of the best items/s measured (a larger one adds latency and, on a CPU, often lowers the
  rate as its activations leave the cache), and a wait of a quarter of that batch's forward pass (a request waits
  at most a quarter of the time it will then spend in the model, long enough for concurrent requests to join it).
  With spreading (below) most batches are smaller than that batch: each waits a quarter of the pass of the batch
  it is cut to (`spread_waits`, from the same calibration), not of the largest one's.
- **Spreading** (reward.batching.spread) on where the batch is chosen here: the calibration measures the model, not
  the traffic, so the batcher caps each batch at the items outstanding over its slots (batcher.py): a batch chosen
  larger than the clients can fill no longer leaves a model process idle while it waits to fill.

Pure, but for `time_forward_passes`, which runs the forward function it is given and reads the clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from cooper.config import RewardConfig

CALIBRATION_TOKENS = 128
"""Length of the calibration's inputs: a question, a reference and a short solution in VerifyRM's template."""
CALIBRATION_MAX_BATCH = 256
CALIBRATION_MAX_PASS_S = 0.25
"""No larger batch is timed once one pass takes longer than this (a large model on a CPU: start-up stays short)."""
GOOD_ENOUGH = 0.9
"""The smallest batch whose items/s reach this share of the best is chosen."""
WAIT_SHARE_OF_PASS = 0.25


@dataclass(frozen=True)
class Chosen:
    """A serving setting and why it was chosen (logged at start-up)."""

    value: float
    why: str


def machine_cores() -> int:
    """Physical cores this process may run on: the CPUs it is allowed (a container's limit included), at most the
    machine's physical cores (two SMT siblings share one core's arithmetic)."""
    import psutil

    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(allowed, psutil.cpu_count(logical=False) or allowed))


def gpu_visible(device: str) -> bool:
    """Whether the model will run on a GPU, without importing torch (the serving process starts the model process
    before its own heavy imports, model_process.py): "auto" looks for NVIDIA's device nodes."""
    if device != "auto":
        return device.startswith("cuda")
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidiactl")


def choose_model_copies(cores: int, torch_threads: int | None, gpu: bool, model_process: bool) -> Chosen:
    """reward.model_copies where it is unset."""
    if not model_process:
        return Chosen(1, "reward.model_process is off: the model runs on a thread of the serving process")
    if gpu:
        return Chosen(1, "on a GPU one process batches across requests; serve more with read replicas")
    threads = torch_threads or omp_threads() or cores
    copies = max(1, cores // threads)
    return Chosen(copies, f"{cores} physical core(s) / {threads} torch thread(s) per process")


def omp_threads() -> int | None:
    """The thread count torch takes from OMP_NUM_THREADS when reward.torch_threads is unset; None if not set."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def choose_batch(seconds_per_pass: dict[int, float]) -> Chosen:
    """reward.batching.max_batch_size from the calibration's time of one forward pass per batch size."""
    if not seconds_per_pass:
        raise ValueError("no calibration measurements to choose a batch from")
    rates = {size: size / seconds for size, seconds in seconds_per_pass.items()}
    best = max(rates.values())
    size = min(s for s, rate in rates.items() if rate >= GOOD_ENOUGH * best)
    measured = ", ".join(f"{s}: {rate:.0f}" for s, rate in sorted(rates.items()))
    return Chosen(size, f"the smallest batch within {GOOD_ENOUGH} of the best items/s on {CALIBRATION_TOKENS}-token "
                        f"inputs (calibration, items/s by batch: {measured})")


def choose_wait(pass_seconds: float) -> Chosen:
    """reward.batching.max_wait_ms from the time of one forward pass of the batch in use."""
    pass_ms = pass_seconds * 1000
    return Chosen(round(max(0.1, WAIT_SHARE_OF_PASS * pass_ms), 1),
                  f"{WAIT_SHARE_OF_PASS} of one forward pass of the batch ({pass_ms:.1f} ms)")


def spread_waits(seconds_per_pass: dict[int, float], max_batch: int) -> list[float]:
    """The wait in ms of a batch cut to 1, 2, ..., max_batch items: WAIT_SHARE_OF_PASS of its forward pass, read
    from the calibration's passes (interpolated between the sizes timed); index 0 is unused."""
    sizes = sorted(seconds_per_pass)
    waits = [0.0]
    for size in range(1, max_batch + 1):
        above = next((s for s in sizes if s >= size), sizes[-1])
        below = max((s for s in sizes if s <= size), default=above)
        share = 0.0 if above == below else (size - below) / (above - below)
        pass_s = seconds_per_pass[below] + share * (seconds_per_pass[above] - seconds_per_pass[below])
        waits.append(round(max(0.1, WAIT_SHARE_OF_PASS * pass_s * 1000), 2))
    return waits


def time_pass(forward: Callable[[int], object], size: int, repeats: int = 3) -> float:
    """The fastest of `repeats` timings of forward(size), after one untimed pass."""
    forward(size)
    timings = []
    for _ in range(repeats):
        start = time.perf_counter()
        forward(size)
        timings.append(time.perf_counter() - start)
    return min(timings)


def time_forward_passes(forward: Callable[[int], object]) -> dict[int, float]:
    """time_pass for batch sizes 1, 2, 4, ..., until a pass takes longer than CALIBRATION_MAX_PASS_S, two sizes in a
    row fall below GOOD_ENOUGH of the best rate (past the peak), or CALIBRATION_MAX_BATCH."""
    seconds: dict[int, float] = {}
    size, below = 1, 0
    while size <= CALIBRATION_MAX_BATCH:
        seconds[size] = time_pass(forward, size)
        best = max(s / t for s, t in seconds.items())
        below = below + 1 if size / seconds[size] < GOOD_ENOUGH * best else 0
        if seconds[size] > CALIBRATION_MAX_PASS_S or below == 2:
            break
        size *= 2
    return seconds


def with_model_copies(config: RewardConfig) -> tuple[RewardConfig, Chosen | None]:
    """The config with reward.model_copies chosen where it is unset, and the choice (None when it was set)."""
    if config.model_copies is not None:
        return config, None
    chosen = choose_model_copies(machine_cores(), config.torch_threads, gpu_visible(config.device),
                                 config.model_process)
    return config.model_copy(update={"model_copies": int(chosen.value)}), chosen


def with_batching(config: RewardConfig,
                  forward: Callable[[int], object]) -> tuple[RewardConfig, list[str], list[float] | None]:
    """The config with the batch and wait chosen where they are unset, by timing `forward(batch_size)` (a forward
    pass of that many CALIBRATION_TOKENS-token inputs), the reasons ([] when both were set: nothing is timed), and,
    where both were chosen and batches are spread, the wait per batch size (spread_waits; else None: every batch
    waits max_wait_ms). reward.batching.spread, where unset, follows whether the batch is chosen here."""
    batching = config.batching
    reasons = []
    if batching.spread is None:
        spread = batching.max_batch_size is None
        batching = batching.model_copy(update={"spread": spread})
        config = config.model_copy(update={"batching": batching})
        if spread:
            reasons.append("spread=True: with the batch chosen, each batch is cut no larger than the items waiting "
                           "and in flight over the batch slots, so every model copy has work")
    if batching.max_batch_size is not None and batching.max_wait_ms is not None:
        return config, reasons, None
    if batching.max_batch_size is None:
        seconds = time_forward_passes(forward)
        batch = choose_batch(seconds)
        size = int(batch.value)
        reasons.append(f"max_batch_size={size}: {batch.why}")
    else:
        size = batching.max_batch_size
        seconds = {size: time_pass(forward, size)}
    update: dict[str, float] = {"max_batch_size": size}
    waits = None
    if batching.max_wait_ms is None:
        wait = choose_wait(seconds[size])
        update["max_wait_ms"] = wait.value
        reasons.append(f"max_wait_ms={wait.value}: {wait.why}")
        if batching.spread and batching.max_batch_size is None:
            waits = spread_waits(seconds, size)
            reasons.append(f"spread batches wait {WAIT_SHARE_OF_PASS} of their own pass: {waits[1]} ms for one "
                           f"item, {waits[size]} ms for {size}")
    return config.model_copy(update={"batching": batching.model_copy(update=update)}), reasons, waits

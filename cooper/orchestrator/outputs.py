"""What a run leaves in runs/<name>/: metrics.jsonl, TensorBoard events, and the console summary (its plot.png:
cooper/launcher/plot.py; W&B and MLflow: trackers.py)."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import os
import socket
import statistics
import struct
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cooper.metric_names import (
    CRITICAL,
    PAIR_ACCURACY_AFTER,
    PAIRS,
    POLICY_VERSION,
    REWARD_ACCURACY_GAP,
    REWARD_MEAN,
    REWARD_VERSION_USED,
    RM_BENCH_ACCURACY,
    RM_VERIFIER_DISAGREEMENT,
    STEP,
    TEST,
    TIME,
    VERIFIER_ACCURACY,
)
from cooper.orchestrator.trackers import Tracker, each_tracker
from cooper.runtime.files import write_atomically

log = logging.getLogger("cooper.orchestrator")


class MetricsLog:
    """Appends one JSON line per step and mirrors the numbers to TensorBoard (unless run.loggers leaves it out) and
    to the run's other trackers (W&B, MLflow: trackers.py), with the alarm's events.

    The event file holds what torch's SummaryWriter.add_scalar writes (a file_version event, then one scalar event
    per number, `simple_value`), in TensorBoard's record framing (`_tfrecord`), written in this thread. Not torch's
    writer: importing it imports torch, 2-3 s of CPU in the orchestrator while the first step runs; nor tensorboard's
    own (0.3 s more to import, and its writer thread: a Ctrl-C that lands while a step's events are queued can leave
    that thread asleep on a full queue until its flush interval, 2 minutes, ends, and the run's stop waits for it)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, trackers: Sequence[Tracker] = ()):
        self.path = run_dir / "metrics.jsonl"
        self.run_dir = run_dir
        self.trackers = list(trackers)
        self._events: Any = None
        if not tensorboard:
            return
        try:
            from tensorboard.compat.proto.event_pb2 import Event
            from tensorboard.compat.proto.summary_pb2 import Summary
        except ImportError:  # tensorboard is a dependency; without it we still write JSONL and the plot
            return
        self._event, self._summary = Event, Summary
        folder = run_dir / "tensorboard"
        folder.mkdir(parents=True, exist_ok=True)
        # TensorBoard's naming: a resumed run adds a file beside the earlier ones.
        name = f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}.{next(_FILES)}"
        self._events = open(folder / name, "wb")  # noqa: SIM115 (closed by close())
        self._events.write(_tfrecord(Event(wall_time=time.time(), file_version="brain.Event:2").SerializeToString()))
        self._events.flush()

    def write(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        step, values = record[STEP], numbers(record)
        if self._events is not None:
            for key, value in values.items():
                summary = self._summary(value=[self._summary.Value(tag=key, simple_value=value)])
                event = self._event(summary=summary, wall_time=time.time(), step=step)
                self._events.write(_tfrecord(event.SerializeToString()))
            self._events.flush()
        each_tracker(self.trackers, "log", step, values)

    def catch_up(self, records: list[dict[str, Any]]) -> None:
        """A resumed run: give each tracker the logged steps it may not hold (Tracker.missing)."""
        by_step = {record[STEP]: record for record in records}
        for tracker in self.trackers:
            try:
                for step in tracker.missing(sorted(by_step)):
                    tracker.log(step, numbers(by_step[step]))
            except Exception as err:  # noqa: BLE001 (as each_tracker: the run goes on)
                log.warning("%s: catching up failed (%s: %s); metrics.jsonl has everything", type(tracker).__name__,
                            type(err).__name__, err)

    def alarm(self, event: Mapping[str, Any]) -> None:
        """A raise or clear of the reward-hacking alarm (alarms.jsonl has it already)."""
        each_tracker(self.trackers, "alarm", event)

    def close(self) -> None:
        if self._events is not None:
            self._events.close()


def numbers(record: Mapping[str, Any]) -> dict[str, float]:
    """A step record's numbers as the trackers get them: every int and float but the step (no bools, no text)."""
    return {key: float(value) for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != STEP}


_FILES = itertools.count()
"""Event files opened by this process, the last part of their names."""


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_CRC32C = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), masked as TFRecord masks it. In Python: a step's events are a few kilobytes."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _tfrecord(data: bytes) -> bytes:
    """One record as TensorBoard reads it: the length (uint64), its masked CRC, the data, the data's masked CRC."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc32c(length)) + data + struct.pack("<I", _masked_crc32c(data))


def trim_metrics(run_dir: Path, logged_through: int) -> list[int]:
    """Drop from metrics.jsonl the lines of steps after `logged_through` (the run state's last logged step), and a
    line cut short; returns the dropped steps (-1 for a cut line).

    The driver appends a step's line before it records the step as logged: a run killed between the two writes
    has a line for a step the resumed run logs again, which would log that step twice."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    kept, dropped = [], []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line)[STEP]
        except (ValueError, KeyError):  # killed in the middle of writing it
            dropped.append(-1)
            continue
        if step <= logged_through:
            kept.append(line)
        else:
            dropped.append(step)
    if dropped:
        write_atomically(path, "".join(line + "\n" for line in kept))
    return dropped


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The run's step records; if a step was logged twice (a resumed run), the last line wins. A run kept compressed
    (metrics.jsonl.gz: the alarm's regression data, bench/data/alarm-runs/) is read the same way."""
    path, packed = run_dir / "metrics.jsonl", run_dir / "metrics.jsonl.gz"
    if path.exists():
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return []
    by_step: dict[int, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            by_step[record[STEP]] = record
    return [by_step[s] for s in sorted(by_step)]


def summary_table(records: list[dict[str, Any]]) -> str:
    """A small fixed-width table of the first, middle and last steps."""
    if not records:
        return "no steps recorded"
    columns = [("step", STEP), ("reward", REWARD_MEAN), ("verifier acc", VERIFIER_ACCURACY),
               ("gap", REWARD_ACCURACY_GAP),
               ("RM-verifier disagree", RM_VERIFIER_DISAGREEMENT), ("pairs", PAIRS),
               ("pair acc after", PAIR_ACCURACY_AFTER), ("RM v", REWARD_VERSION_USED),
               ("policy v", POLICY_VERSION)]
    columns += [(k.removeprefix(TEST) + " test acc", k)
                for k in sorted({k for r in records for k in r if k.startswith(TEST)})]
    if any(RM_BENCH_ACCURACY in r for r in records):
        columns.append(("RM bench acc", RM_BENCH_ACCURACY))
    picks = sorted({0, len(records) // 2, len(records) - 1})
    rows = [[name for name, _ in columns]]
    for i in picks:
        r = records[i]
        rows.append([_fmt(r.get(key)) for _, key in columns])
    return _table(rows)


def stage_time_table(records: list[dict[str, Any]]) -> str:
    """Per stage, the median of its seconds a step (`time/<stage>`) and of its seconds on the step's critical path
    (`time/critical/<stage>`): what each stage costs the step, beside how long it runs. Steps of a resumed run's
    first process and of its next one alike; the initial evaluation left out."""
    stages = sorted({key.removeprefix(CRITICAL) for r in records for key in r if key.startswith(CRITICAL)})
    if not stages:
        return ""
    rows = [["stage", "s a step", "s on the critical path"]]
    for stage in stages:
        ran = [r[TIME + stage] for r in records if TIME + stage in r]
        waited = [r[CRITICAL + stage] for r in records if CRITICAL + stage in r]
        rows.append([stage, _fmt(statistics.median(ran)) if ran else "-", _fmt(statistics.median(waited))])
    return "medians over the steps:\n" + _table(rows)


def _table(rows: list[list[str]]) -> str:
    """Fixed-width columns, right-aligned, the first row a header underlined."""
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)

"""Training and evaluation data: JSONL or parquet rows with `question` and `answer`, or the tiny preset.

The prompts of step t are a pure function of (seed, t): epoch e is a seeded permutation of the training rows, and
step t takes rows [t*B, (t+1)*B) of the concatenated epochs. So the data position is just the step, a resumed run
neither skips nor repeats a prompt, and no cursor has to be kept consistent with anything.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from cooper.config import CooperConfig


@dataclass(frozen=True)
class Example:
    id: str
    question: str
    answer: str
    data_source: str = ""


class DataError(ValueError):
    """A data file that cannot be used; the message names the file and row."""


def read_rows(path: str | Path, source: str = "") -> list[Example]:
    """Rows of a JSONL or parquet file; each needs `question` and `answer` (`id`, `data_source` optional)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as err:
            raise DataError(f"{path}: reading parquet needs pyarrow (pip install pyarrow)") from err
        raw = pq.read_table(path).to_pylist()
    else:
        raw = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    raw.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise DataError(f"{path}:{n}: not valid JSON ({err.msg})") from None
    rows = []
    for n, row in enumerate(raw, 1):
        if not isinstance(row, dict) or "question" not in row or "answer" not in row:
            raise DataError(f"{path}: row {n} needs 'question' and 'answer' fields")
        rows.append(Example(
            id=str(row.get("id", f"{path.stem}-{n - 1}")), question=str(row["question"]), answer=str(row["answer"]),
            data_source=str(row.get("data_source", source or path.stem)),
        ))
    if not rows:
        raise DataError(f"data file {path} has no rows")
    return rows


def tiny_splits(seed: int, train_size: int = 2000, test_size: int = 64, two_step_share: float | None = None,
                ) -> tuple[list[Example], dict[str, list[Example]]]:
    """The tiny task's training prompts and its two test sets: `heldout`, problems whose arithmetic no model ever
    saw (tiny/task.py holds its facts out of every other split), and `seen`, new problems over the training facts
    (in-distribution: the same arithmetic as the training prompts, other names and numbers of draws).
    `two_step_share` of the training prompts and of `seen` are two-step (None: the task's own share)."""
    from cooper.tiny.task import HELD_OUT_SPLIT, make_split

    def convert(problems, source):  # type: ignore[no-untyped-def]
        return [Example(p.id, p.question, p.answer, source) for p in problems]

    tests = {"heldout": convert(make_split(test_size, seed, HELD_OUT_SPLIT), "heldout"),
             "seen": convert(make_split(test_size, seed, "test", two_step_share), "seen")}
    return convert(make_split(train_size, seed, "train", two_step_share), "tiny"), tests


def load_data(config: CooperConfig) -> tuple[list[Example], dict[str, list[Example]]]:
    """(training rows, {benchmark: test rows}) as the config says."""
    data = config.data
    if data.preset == "tiny":
        return tiny_splits(config.run.seed, test_size=data.tiny_test_size, two_step_share=data.tiny_two_step_share)
    assert data.train_path is not None  # the config validator guarantees it
    return read_rows(data.train_path), {name: read_rows(path, name) for name, path in data.test_paths.items()}


def prompt_text(config: CooperConfig, example: Example) -> str:
    return config.data.prompt_template.replace("{question}", example.question)


class StepData:
    """`batch(t)`: the B examples of step t, in seeded, shuffled epochs."""

    def __init__(self, rows: list[Example], batch_size: int, seed: int):
        self.rows, self.batch_size, self.seed = rows, batch_size, seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}:{epoch}").shuffle(order)
            self._orders = {epoch: order}  # steps move forward: keep one epoch's order
        return self._orders[epoch]

    def position(self, step: int) -> tuple[int, int]:
        """(epoch, offset within the epoch) of step `step`'s first example."""
        return divmod(step * self.batch_size, len(self.rows))

    def batch(self, step: int) -> list[Example]:
        out = []
        for k in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, offset = divmod(k, len(self.rows))
            out.append(self.rows[self._order(epoch)[offset]])
        return out

"""VerifyRM and the rule verifier judged against human labels, on a benchmark in VerifyBench's format.

A benchmark file is JSON Lines, one judged completion per line (the field names of VerifyBench, Yan et al. 2025,
github.com/ZJU-REAL/VerifyBench; other fields such as `question_id`, `completion_model` or `source` are ignored):

    question      str   the problem
    answer        str   the reference answer (`reference` or `target` are read when `answer` is absent)
    completion    str   a model's solution to judge
    gold_correct  bool  the human label: is the completion correct?
    answer_type   str   optional, e.g. "Numerical Values"; the report breaks accuracy down by it ("unknown" if absent)

A judge *says correct* for a completion: VerifyRM when sigmoid(logit) > 0.5, the verifier when its verdict is
CORRECT (INCORRECT, NO_ANSWER, TIMEOUT and ERROR all say not correct). Accuracy is agreement with `gold_correct`,
overall and per answer type. VerifyRM also gets AUROC, which needs no threshold: the chance that a correct
completion scores above an incorrect one. The verifier gives no score, so it has no AUROC; its verdict counts show
where it misses (NO_ANSWER on correct answers in unusual forms is its typical failure).

Everything here is pure (reading, metrics, table): neither torch nor services. `cooper eval-rm` (cooper/eval_rm.py)
loads VerifyRM and starts verifier workers, or uses running services. Left out: confidence intervals (the report
gives n, so a reader can judge) and VerifyBench-Hard's extra fields.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cooper.evaluation.monitor import auroc
from cooper.jsonl import read_json_objects
from cooper.reward_rule import accepts_score

UNKNOWN_TYPE = "unknown"
TINY = "tiny"  # names the benchmark built from the tiny task instead of a file
REFERENCE_FIELDS = ("answer", "reference", "target")


class BenchInputError(ValueError):
    """A benchmark file that cannot be used; the message names the file, the line and the field."""


@dataclass(frozen=True)
class BenchItem:
    """One completion with its human label."""

    question: str
    reference: str
    completion: str
    gold_correct: bool
    answer_type: str = UNKNOWN_TYPE


# ----- reading and writing -----


def _field(path: str | Path, number: int, row: dict[str, Any], names: Sequence[str]) -> str:
    for name in names:
        if name in row:
            if not isinstance(row[name], str):
                raise BenchInputError(f"{path}:{number}: field {name!r} must be a string, got "
                                      f"{type(row[name]).__name__}")
            return row[name]
    raise BenchInputError(f"{path}:{number}: missing field {' or '.join(repr(n) for n in names)}")


def _item(path: str | Path, number: int, row: dict[str, Any]) -> BenchItem:
    label = row.get("gold_correct")
    if not isinstance(label, bool):
        got = "missing" if "gold_correct" not in row else f"got {json.dumps(label)}"
        raise BenchInputError(f"{path}:{number}: field 'gold_correct' must be true or false ({got})")
    answer_type = row.get("answer_type") or UNKNOWN_TYPE
    if not isinstance(answer_type, str):
        raise BenchInputError(f"{path}:{number}: field 'answer_type' must be a string")
    return BenchItem(_field(path, number, row, ("question",)), _field(path, number, row, REFERENCE_FIELDS),
                     _field(path, number, row, ("completion",)), label, answer_type)


def read_bench(path: str | Path) -> list[BenchItem]:
    """The items of a VerifyBench-format JSON Lines file, in file order."""
    if not Path(path).is_file():
        raise BenchInputError(f"{path}: no such file")
    items = [_item(path, number, row) for number, row in read_json_objects(path, BenchInputError)]
    if not items:
        raise BenchInputError(f"{path}: no items in the file")
    return items


def load_bench(source: str) -> list[BenchItem]:
    """`tiny`: the tiny task's benchmark (tiny_bench); anything else: a file (read_bench)."""
    return tiny_bench() if source == TINY else read_bench(source)


def write_bench(path: str | Path, items: Sequence[BenchItem]) -> None:
    """JSON Lines in the format read_bench reads (the reference under `answer`)."""
    rows = [{"question": i.question, "answer": i.reference, "completion": i.completion,
             "gold_correct": i.gold_correct, "answer_type": i.answer_type} for i in items]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


ANSWERLESS = "We compute the total. The answer is"


def tiny_bench(n: int = 96, seed: int = 0) -> list[BenchItem]:
    """A labelled benchmark from the tiny arithmetic task: per problem, one completion that is right (half), has
    a wrong final number (a third), or gives no answer at all (the rest). Every answer is an integer, so
    `answer_type` names the kind of completion instead ("right", "wrong number", "no answer"): the report then shows
    which kind each judge gets wrong. The problems come from a split of their own ("rm-bench"), not the training,
    test or VerifyRM pre-training splits."""
    from cooper.tiny.task import make_split, wrong_solution

    rng = random.Random(f"rm-bench:{seed}")
    items = []
    for problem in make_split(n, seed, "rm-bench"):
        draw = rng.random()
        if draw < 0.5:
            completion, correct, kind = problem.solution, True, "right"
        elif draw < 0.83:
            completion, correct, kind = wrong_solution(problem, rng), False, "wrong number"
        else:
            completion, correct, kind = ANSWERLESS, False, "no answer"
        items.append(BenchItem(problem.question, problem.answer, completion, correct, kind))
    return items


# ----- metrics -----


@dataclass(frozen=True)
class JudgeReport:
    """How one judge's says-correct decisions agree with the labels."""

    accuracy: float
    by_type: dict[str, dict[str, float]]  # answer type -> {"n", "accuracy"}
    says_correct: float  # share of items the judge calls correct
    auroc: float | None = None
    false_positive_rate: float | None = None  # share of the wrong items (gold_correct false) it calls correct
    negatives: int = 0  # how many wrong items that share is of

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge_report(items: Sequence[BenchItem], says_correct: Sequence[bool],
                 scores: Sequence[float] | None = None) -> JudgeReport:
    """Accuracy overall and per answer type of `says_correct` (one per item); AUROC when `scores` are given."""
    if len(says_correct) != len(items) or (scores is not None and len(scores) != len(items)):
        raise ValueError(f"expected one decision (and score) per item: {len(items)} items")
    if not items:
        raise ValueError("no items to judge")
    hits = [said == item.gold_correct for said, item in zip(says_correct, items, strict=True)]
    by_type: dict[str, dict[str, float]] = {}
    for answer_type in sorted({item.answer_type for item in items}):
        rows = [hit for hit, item in zip(hits, items, strict=True) if item.answer_type == answer_type]
        by_type[answer_type] = {"n": len(rows), "accuracy": sum(rows) / len(rows)}
    accepted_wrong = [said for said, item in zip(says_correct, items, strict=True) if not item.gold_correct]
    return JudgeReport(
        accuracy=sum(hits) / len(hits), by_type=by_type, says_correct=sum(says_correct) / len(says_correct),
        auroc=None if scores is None else auroc(scores, [item.gold_correct for item in items]),
        false_positive_rate=sum(accepted_wrong) / len(accepted_wrong) if accepted_wrong else None,
        negatives=len(accepted_wrong),
    )


def reward_model_report(items: Sequence[BenchItem], scores: Sequence[float]) -> JudgeReport:
    """VerifyRM says correct when its score (sigmoid of the logit) is above 0.5."""
    return judge_report(items, [accepts_score(score) for score in scores], scores)


def verifier_report(items: Sequence[BenchItem], verdicts: Sequence[str]) -> JudgeReport:
    """The verifier says correct when its verdict is CORRECT."""
    return judge_report(items, [verdict == "CORRECT" for verdict in verdicts])


def compare_judges(items: Sequence[BenchItem], scores: Sequence[float], verdicts: Sequence[str]) -> dict[str, Any]:
    """The report of `cooper eval-rm`: both judges on the same items, plus the verifier's verdict counts."""
    return {
        "n": len(items), "gold_correct": sum(item.gold_correct for item in items),
        "verifyrm": reward_model_report(items, scores).as_dict(),
        "verifier": {**verifier_report(items, verdicts).as_dict(), "verdicts": dict(Counter(verdicts))},
    }


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def format_table(report: dict[str, Any]) -> str:
    """A fixed-width table: per answer type and overall, n and the accuracy of each judge; then AUROC and verdicts."""
    rm, verifier = report["verifyrm"], report["verifier"]
    rows = [["answer type", "n", "VerifyRM acc", "verifier acc"]]
    for answer_type, cell in rm["by_type"].items():
        rows.append([answer_type, str(cell["n"]), _cell(cell["accuracy"]),
                     _cell(verifier["by_type"][answer_type]["accuracy"])])
    rows.append(["all", str(report["n"]), _cell(rm["accuracy"]), _cell(verifier["accuracy"])])
    widths = [max(len(row[c]) for row in rows) for c in range(4)]
    lines = ["  ".join(cell.ljust(w) if c == 0 else cell.rjust(w) for c, (cell, w) in enumerate(zip(row, widths,
                                                                                                  strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(-1, lines[1])
    verdicts = ", ".join(f"{name} {count}" for name, count in sorted(verifier["verdicts"].items()))
    lines.append(f"VerifyRM AUROC {_cell(rm['auroc'])}; says correct on {rm['says_correct']:.1%} "
                 f"(gold: {report['gold_correct'] / report['n']:.1%}); verifier verdicts: {verdicts}")
    return "\n".join(lines)

"""The paper's datasets, from their published formats to the rows Cooper reads (`cooper data`).

Cooper's training and test files are JSON Lines with `question`, `answer` (the reference that the verifier and
VerifyRM compare completions with), `id` and `data_source` (orchestrator/data.py). Each source publishes its own
fields; this module reads them and extracts the reference answer the way each source states it:

| format         | question                                  | reference answer                                   | id            |
| -------------- | ----------------------------------------- | -------------------------------------------------- | ------------- |
| gsm8k          | `question`                                | `answer` after its last `####`, commas dropped     | (row number)  |
| svamp          | `Body` + " " + `Question`, or             | `Answer`, a number (8.0 -> "8")                    | `ID`          |
|                | `question_concat` in dumps that have it   |                                                    |               |
| math500        | `problem`                                 | `answer`; without it, the last \\boxed{} of        | `unique_id`   |
|                |                                           | `solution` (so the full MATH set works too)        |               |
| olympiadbench  | `question`, after `context` when present  | `final_answer`, a list: each item's $...$ removed, | `id`          |
|                |                                           | joined with ", " (multiple answers)                |               |
| math_odyssey   | `question`, or `problem`                  | `answer` ($...$ or \\boxed{} around it removed);   | `question_id` |
|                |                                           | without it, the last \\boxed{} of `reasoning`      | or `id`       |

Field names follow the Hugging Face copies: openai/gsm8k, ChilleD/SVAMP, HuggingFaceH4/MATH-500, Hothan/OlympiadBench
(whose `final_answer` is a list of LaTeX strings; `unit` is left out of the reference, as the verifier compares
values) and MathOdyssey (mengfn/MathOdyssey). The GSM8K, SVAMP and MATH-500 fields are the well-known ones; the
OlympiadBench and MathOdyssey fields are assumed from their dataset cards and repositories, not checked against the
files. MathOdyssey's `label` is the problem's subject ("Algebra", "Combinatorics": the table in
github.com/mengf1/mathodyssey), never the answer, so it is not read as one. Rows without a usable question or
answer fail with the file, row and field named (or are skipped with `skip_invalid`), never silently dropped.

Input: JSON Lines, a JSON array (SVAMP and OlympiadBench ship .json files), or parquet (needs pyarrow, which Cooper
does not require). The format is detected from the first row's fields, or named.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cooper.boxed import last_boxed
from cooper.runtime.files import write_atomically


class DatasetFormatError(ValueError):
    """An input that cannot be converted; the message names the file, the row and the field."""


class InvalidRow(DatasetFormatError):
    """One row without a usable question or reference answer."""


# ----- answer extraction -----


def strip_math_delimiters(text: str) -> str:
    """"$x$", "$$x$$", "\\(x\\)", "\\[x\\]" -> "x"; a \\boxed{x} around the whole answer -> "x"."""
    text = text.strip()
    for left, right in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        inner = text[len(left) : -len(right)]
        # "$1$ and $2$" is two formulas, not one wrapped in $...$: left as it is
        if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right) and "$" not in inner:
            text = inner.strip()
            break
    boxed = last_boxed(text, fbox=True, strict=True, strip=True)
    if boxed is not None and text.startswith(("\\boxed{", "\\fbox{")) and text.endswith("}"):
        text = boxed
    return text


def gsm8k_answer(solution: str) -> str | None:
    """The number after the last `####` of a GSM8K solution, without thousands separators."""
    if "####" not in solution:
        return None
    return solution.rsplit("####", 1)[1].strip().replace(",", "") or None


def number_text(value: Any) -> str | None:
    """A published number as the verifier should see it: 8.0 -> "8", 0.5 -> "0.5", "12" -> "12"."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else repr(float(value))
    text = str(value).strip()
    try:
        return number_text(float(text)) if text else None
    except ValueError:
        return text


# ----- the formats -----


@dataclass(frozen=True)
class Converted:
    """One row in Cooper's format."""

    id: str
    question: str
    answer: str
    data_source: str

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "question": self.question, "answer": self.answer, "data_source": self.data_source}


def _text(row: dict[str, Any], *names: str) -> str | None:
    """The first of `names` that holds a non-empty string (numbers are written as text)."""
    for name in names:
        value = row.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _require(value: str | None, field: str) -> str:
    if value is None:
        raise InvalidRow(f"no usable {field}")
    return value


def _gsm8k(row: dict[str, Any]) -> tuple[str, str, str | None]:
    solution = _require(_text(row, "answer"), "'answer'")
    return (_require(_text(row, "question"), "'question'"),
            _require(gsm8k_answer(solution), "'answer' (no number after '####')"), None)


def _svamp(row: dict[str, Any]) -> tuple[str, str, str | None]:
    body, question = _text(row, "Body"), _text(row, "Question")
    text = f"{body} {question}" if body and question else _text(row, "question_concat")
    answer = number_text(row.get("Answer"))
    return _require(text, "'Body' and 'Question' (or 'question_concat')"), _require(answer, "'Answer'"), \
        _text(row, "ID")


def _math500(row: dict[str, Any]) -> tuple[str, str, str | None]:
    answer = _text(row, "answer")
    if answer is None:
        solution = _text(row, "solution")
        answer = last_boxed(solution, fbox=True, strict=True, strip=True) if solution else None
    return (_require(_text(row, "problem"), "'problem'"),
            _require(answer, "'answer' (nor a \\boxed{} in 'solution')"), _text(row, "unique_id"))


def _olympiadbench(row: dict[str, Any]) -> tuple[str, str, str | None]:
    final = row.get("final_answer")
    items = final if isinstance(final, list) else [final] if isinstance(final, str) else []
    answers = [strip_math_delimiters(a) for a in items if isinstance(a, str) and a.strip()]
    question = _require(_text(row, "question"), "'question'")
    context = _text(row, "context")
    return (f"{context}\n{question}" if context else question,
            _require(", ".join(answers) or None, "'final_answer' (a non-empty list)"), _text(row, "id"))


def _math_odyssey(row: dict[str, Any]) -> tuple[str, str, str | None]:
    answer = _text(row, "answer")
    if answer is not None:
        answer = strip_math_delimiters(answer)
    else:
        reasoning = _text(row, "reasoning", "solution")
        answer = last_boxed(reasoning, fbox=True, strict=True, strip=True) if reasoning else None
    return (_require(_text(row, "question", "problem"), "'question' or 'problem'"),
            _require(answer or None, "'answer' (nor a \\boxed{} in 'reasoning')"), _text(row, "question_id", "id"))


@dataclass(frozen=True)
class SourceFormat:
    name: str
    detect: Callable[[dict[str, Any]], bool]
    """Whether a row has this format's telltale fields."""
    convert: Callable[[dict[str, Any]], tuple[str, str, str | None]]
    """row -> (question, reference answer, id or None); raises InvalidRow."""


FORMATS: dict[str, SourceFormat] = {f.name: f for f in [
    SourceFormat("gsm8k", lambda r: set(r) >= {"question", "answer"} and "####" in str(r["answer"]), _gsm8k),
    SourceFormat("svamp", lambda r: set(r) >= {"Body", "Question", "Answer"} or "question_concat" in r, _svamp),
    SourceFormat("math500", lambda r: "problem" in r and "solution" in r and "reasoning" not in r, _math500),
    SourceFormat("olympiadbench", lambda r: "final_answer" in r, _olympiadbench),
    SourceFormat("math_odyssey", lambda r: ("reasoning" in r or {"label", "level", "answer"} <= set(r))
                 and ("question" in r or "problem" in r) and "solution" not in r, _math_odyssey),
]}


def detect_format(row: dict[str, Any], path: str | Path) -> str:
    """The one format whose telltale fields the row has."""
    matches = [name for name, f in FORMATS.items() if f.detect(row)]
    if len(matches) == 1:
        return matches[0]
    fields = ", ".join(sorted(map(str, row)))
    if not matches:
        raise DatasetFormatError(f"{path}: row 1 (fields: {fields}) matches no known format; name one with "
                                 f"--format ({', '.join(FORMATS)})")
    raise DatasetFormatError(f"{path}: row 1 matches several formats ({', '.join(matches)}); name one with --format")


# ----- files -----


def read_source(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a JSON Lines, JSON array or parquet file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise DatasetFormatError(f"{path}: no such file")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DatasetFormatError(f"{path}: reading parquet needs pyarrow (pip install pyarrow), or convert the "
                                     "file to JSON Lines first") from None
        rows: list[Any] = pq.read_table(path).to_pylist()
    else:
        text = path.read_text(encoding="utf-8")
        if text.lstrip().startswith("["):  # a JSON array
            try:
                rows = json.loads(text)
            except json.JSONDecodeError as err:
                raise DatasetFormatError(f"{path}: not a JSON array ({err.msg} at line {err.lineno})") from None
        else:
            rows = []
            for number, line in enumerate(text.splitlines(), 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as err:
                        raise DatasetFormatError(f"{path}:{number}: not JSON ({err.msg})") from None
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise DatasetFormatError(f"{path}: row {number} is a {type(row).__name__}, not an object")
    if not rows:
        raise DatasetFormatError(f"{path}: no rows in the file")
    return rows


@dataclass(frozen=True)
class Conversion:
    format: str
    rows: list[Converted]
    skipped: list[str]  # why each skipped row was skipped ("row 3: no usable 'answer'")


def convert_rows(rows: Sequence[dict[str, Any]], path: str | Path, format: str | None = None,
                 source: str | None = None, skip_invalid: bool = False) -> Conversion:
    """Rows of one source file in Cooper's format. `format` None detects it from the first row; `source` (default:
    the format's name) becomes `data_source` and the prefix of generated ids. An invalid row fails the conversion
    unless skip_invalid, which skips it and says why."""
    if format is not None and format not in FORMATS:
        raise DatasetFormatError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    name = format or detect_format(rows[0], path)
    source = source or name
    out, skipped = [], []
    for number, row in enumerate(rows, 1):
        try:
            question, answer, row_id = FORMATS[name].convert(row)
        except InvalidRow as err:
            if not skip_invalid:
                raise DatasetFormatError(f"{path}: row {number} ({name}): {err}; fix it or pass --skip-invalid") \
                    from None
            skipped.append(f"row {number}: {err}")
            continue
        out.append(Converted(row_id or f"{source}-{number - 1}", question, answer, source))
    if not out:
        raise DatasetFormatError(f"{path}: no row could be converted ({skipped[0] if skipped else 'empty'})")
    return Conversion(name, out, skipped)


def write_rows(path: str | Path, rows: Sequence[Converted]) -> None:
    """JSON Lines, written to a temporary file and renamed into place."""
    write_atomically(path, "".join(json.dumps(row.as_dict(), ensure_ascii=False) + "\n" for row in rows))


def convert_file(input_path: str | Path, output_path: str | Path, format: str | None = None,
                 source: str | None = None, skip_invalid: bool = False) -> Conversion:
    """`cooper data`: read, convert, write."""
    conversion = convert_rows(read_source(input_path), input_path, format, source, skip_invalid)
    write_rows(output_path, conversion.rows)
    return conversion

"""`cooper data`: the paper's datasets, in small local files written in their published schemas, become rows that
the orchestrator reads and whose references the real verifier accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cooper.cli import main
from cooper.dataset_formats import DatasetFormatError, convert_file, last_boxed, strip_math_delimiters
from cooper.orchestrator.data import read_rows
from cooper.services.verifier.rules import Verdict, check

GSM8K = [
    {"question": "Natalia sold clips to 48 friends in April, and half as many in May. How many in all?",
     "answer": "In May she sold 48/2 = <<48/2=24>>24 clips.\nAltogether 48+24 = <<48+24=72>>72 clips.\n#### 72"},
    {"question": "A house costs $1,200 a month. What does a year cost?",
     "answer": "12 * 1200 = <<12*1200=14400>>14400\n#### 14,400"},
]
SVAMP = [
    {"ID": "chal-1", "Body": "Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack",
     "Question": "How much do you have to pay to buy each pack?", "Equation": "( 76.0 - 25.0 )", "Answer": 51.0,
     "Type": "Subtraction"},
    {"ID": "chal-2", "Body": "Dan had 5 pens.", "Question": "How many pens does half of them make?",
     "Equation": "( 5.0 / 2.0 )", "Answer": 2.5, "Type": "Common-Division"},
]
MATH500 = [
    {"problem": "Convert the point $(0,3)$ in rectangular coordinates to polar coordinates.",
     "solution": "We have $r = 3$ and $\\theta = \\frac{\\pi}{2}$, so $\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}$.",
     "answer": "\\left( 3, \\frac{\\pi}{2} \\right)", "subject": "Precalculus", "level": 2,
     "unique_id": "test/precalculus/807.json"},
    {"problem": "What is $\\frac{1}{2} + \\frac{1}{3}$?", "level": "Level 1", "type": "Prealgebra",
     "solution": "The sum is $\\boxed{\\frac{5}{6}}$."},  # the full MATH set: no answer field
]
OLYMPIADBENCH = [
    {"id": 2231, "question": "Find all pairs $(x, y)$ of integers with $x + y = 2$ and $xy = 1$.",
     "solution": ["Then $x = y = 1$."], "final_answer": ["$(1,1)$"], "context": None, "image_1": None,
     "modality": "Text-only", "is_multiple_answer": False, "unit": None, "answer_type": "Tuple",
     "question_type": "Open-ended", "subfield": "Algebra", "subject": "Math", "language": "English"},
    {"id": 2232, "question": "Find all real $x$ with $x^2 = 4$.", "solution": ["..."],
     "final_answer": ["$2$", "$-2$"], "context": "", "is_multiple_answer": True, "unit": None},
]
ODYSSEY = [
    {"question_id": "od-7", "problem": "Evaluate $\\int_0^1 2x\\,dx$.", "answer": "$1$",
     "reasoning": "The antiderivative is $x^2$, so the value is $\\boxed{1}$.", "label": "Calculus and Analysis",
     "level": "University-Level"},
    {"question": "What is $2^{10}$?", "reasoning": "We get $\\boxed{1024}$.", "label": "Algebra",
     "level": "High School Competition"},  # no answer field: the last \\boxed{} of the reasoning
]

EXPECTED = {  # format -> (question of the first row, answers, ids)
    "gsm8k": (GSM8K[0]["question"], ["72", "14400"], ["gsm8k-0", "gsm8k-1"]),
    "svamp": ("Each pack of dvds costs 76 dollars. If there is a discount of 25 dollars on each pack How much do "
              "you have to pay to buy each pack?", ["51", "2.5"], ["chal-1", "chal-2"]),
    "math500": (MATH500[0]["problem"], ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\frac{5}{6}"],
                ["test/precalculus/807.json", "math500-1"]),
    "olympiadbench": (OLYMPIADBENCH[0]["question"], ["(1,1)", "2, -2"], ["2231", "2232"]),
    "math_odyssey": (ODYSSEY[0]["problem"], ["1", "1024"], ["od-7", "math_odyssey-1"]),
}
SOURCES = {"gsm8k": GSM8K, "svamp": SVAMP, "math500": MATH500, "olympiadbench": OLYMPIADBENCH,
           "math_odyssey": ODYSSEY}


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_each_source_is_detected_and_its_reference_extracted(tmp_path: Path, name: str) -> None:
    source = _jsonl(tmp_path / f"{name}.jsonl", SOURCES[name])
    out = tmp_path / "out" / f"{name}.jsonl"
    result = convert_file(source, out)
    question, answers, ids = EXPECTED[name]
    assert result.format == name and not result.skipped
    rows = read_rows(out)  # what data.train_path / data.test_paths read
    assert [r.answer for r in rows] == answers
    assert [r.id for r in rows] == ids
    assert rows[0].question == question
    assert {r.data_source for r in rows} == {name}


def test_references_are_ones_the_verifier_accepts(tmp_path: Path) -> None:
    # Each extracted reference, against a completion that boxes the same answer, is CORRECT under real
    # math-verify (and a wrong one is not): the conversion keeps answers in a form the rules can read.
    for name, rows in SOURCES.items():
        for row in convert_file(_jsonl(tmp_path / f"{name}.jsonl", rows), tmp_path / f"{name}.out.jsonl").rows:
            assert check(f"So the answer is $\\boxed{{{row.answer}}}$.", row.answer, 5).verdict == Verdict.CORRECT, \
                (name, row.answer)
            assert check("So the answer is $\\boxed{12345}$.", row.answer, 5).verdict == Verdict.INCORRECT


def test_json_array_input_named_format_and_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "SVAMP.json"
    source.write_text(json.dumps([{"ID": "a", "question_concat": "Tom has 3 apples and eats 1. How many are left?",
                                   "Answer": "2.0"}], indent=2))
    out = tmp_path / "svamp.jsonl"
    assert main(["data", str(source), "-o", str(out), "--format", "svamp", "--source", "svamp_test"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rows"] == 1
    assert json.loads(out.read_text()) == {"id": "a", "question": "Tom has 3 apples and eats 1. How many are left?",
                                           "answer": "2", "data_source": "svamp_test"}


def test_invalid_rows_fail_naming_the_row_or_are_skipped_when_asked(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    rows = [GSM8K[0], {"question": "q", "answer": "no final answer marker"}, GSM8K[1]]
    source = _jsonl(tmp_path / "gsm8k.jsonl", rows)
    out = tmp_path / "out.jsonl"
    assert main(["data", str(source), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "gsm8k.jsonl: row 2 (gsm8k): no usable 'answer' (no number after '####')" in err
    assert not out.exists()
    assert main(["data", str(source), "-o", str(out), "--skip-invalid"]) == 0
    assert "1 skipped (first: row 2:" in capsys.readouterr().out
    assert [r.answer for r in read_rows(out)] == ["72", "14400"]


def test_unknown_or_ambiguous_input_asks_for_a_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _jsonl(tmp_path / "mystery.jsonl", [{"prompt": "p", "target": "t"}])
    assert main(["data", str(source), "-o", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err
    assert "mystery.jsonl: row 1 (fields: prompt, target) matches no known format" in err and "--format" in err
    assert main(["data", str(source), "-o", str(tmp_path / "o.jsonl"), "--format", "aime"]) == 2
    assert "unknown format 'aime'" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text('{"question": "q"}\n{oops\n')
    assert main(["data", str(tmp_path / "bad.jsonl"), "-o", str(tmp_path / "o.jsonl"), "--format", "gsm8k"]) == 2
    assert "bad.jsonl:2: not JSON" in capsys.readouterr().err


def test_parquet_needs_pyarrow_or_reads_the_same_rows(tmp_path: Path) -> None:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        (tmp_path / "train.parquet").write_bytes(b"PAR1")
        with pytest.raises(DatasetFormatError, match="train.parquet: reading parquet needs pyarrow"):
            convert_file(tmp_path / "train.parquet", tmp_path / "o.jsonl")
        return
    pq.write_table(pa.Table.from_pylist(GSM8K), tmp_path / "train.parquet")
    assert [r.answer for r in convert_file(tmp_path / "train.parquet", tmp_path / "o.jsonl").rows] == ["72", "14400"]


def test_answer_helpers() -> None:
    assert last_boxed("a \\boxed{1} then \\boxed{\\frac{1}{2}} end") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}") == "\\left( 3, \\frac{\\pi}{2} \\right)"
    assert last_boxed("no box") is None and last_boxed("\\boxed{unclosed") is None
    assert strip_math_delimiters(" $x^2$ ") == "x^2" and strip_math_delimiters("\\(3\\)") == "3"
    assert strip_math_delimiters("$\\boxed{7}$") == "7" and strip_math_delimiters("$1$ and $2$") == "$1$ and $2$"

"""`cooper annotate`: hybrid annotation with the real verifier and generator services started by the command, and a
scripted OpenAI-style judge on loopback (an LLM judge cannot run here; the chat server stands in for one)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cooper.annotation import AnnotationInputError, agreed_label, read_labelled, read_triples
from cooper.cli import main

# (completion, what the scripted judge answers); question "What is 2 + 3?", reference "5"
CASES = [
    ("2 + 3 = 5, so the answer is \\boxed{5}. (case A)", "Yes"),  # both correct: kept, true
    ("2 + 3 = 6, so the answer is \\boxed{6}. (case B)", "No"),  # both incorrect: kept, false
    ("Adding gives \\boxed{5}. (case C)", "No"),  # they disagree
    ("Adding gives \\boxed{7}. (case D)", "Yes"),  # they disagree
    ("The sum is \\boxed{5}. (case E)", None),  # the judge gives no verdict
    ("I am not sure what to do here. (case F)", "No"),  # the verifier finds no answer
    ("Five: \\boxed{5} (case G)", "Yes"),  # kept, true
]


def test_agreed_label_needs_two_labels_that_agree() -> None:
    assert agreed_label("CORRECT", "YES") is True and agreed_label("INCORRECT", "NO") is False
    for verifier, judge in [("CORRECT", "NO"), ("INCORRECT", "YES"), ("NO_ANSWER", "NO"), ("TIMEOUT", "YES"),
                            ("ERROR", "NO"), ("CORRECT", "UNKNOWN")]:
        assert agreed_label(verifier, judge) is None


def test_annotate_keeps_what_verifier_and_judge_agree_on(tmp_path: Path, chat_server: Any,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    base_url, script = chat_server
    # Each case is told apart by its letter (a digit would be an answer to math-verify).
    script.reset(replies={f"(case {'ABCDEFG'[i]})": [f"Let me check.\nFinal Judgment: {verdict}"]
                          for i, (_, verdict) in enumerate(CASES) if verdict is not None},
                 default="The completion looks plausible.")
    source = tmp_path / "triples.jsonl"
    rows = [{"question": "What is 2 + 3?", "answer" if i % 2 else "reference": "5", "completion": completion}
            for i, (completion, _) in enumerate(CASES)]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    output = tmp_path / "out" / "labelled.jsonl"

    code = main(["annotate", str(source), "-o", str(output), "--chunk-size", "3", "--no-progress",
                 "generator.assistant.backend=openai", f"generator.assistant.base_url={base_url}",
                 "generator.assistant.model_name=judge-7b", "generator.assistant.retries=0"])
    assert code == 0
    stats = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {k: stats[k] for k in ("total", "verifier_labelled", "judge_labelled", "agreed", "disagreed",
                                  "judge_only_correct", "verifier_only_correct", "kept_correct", "kept_incorrect")} == {
        "total": 7, "verifier_labelled": 6, "judge_labelled": 6, "agreed": 3, "disagreed": 2, "judge_only_correct": 1,
        "verifier_only_correct": 1, "kept_correct": 2, "kept_incorrect": 1}
    kept = [json.loads(line) for line in output.read_text().splitlines()]
    assert [(row["completion"], row["label"], row["verifier"], row["judge"]) for row in kept] == [
        (CASES[0][0], True, "CORRECT", "YES"), (CASES[1][0], False, "INCORRECT", "NO"),
        (CASES[6][0], True, "CORRECT", "YES")]
    assert [label for _, label in read_labelled(output)] == [True, False, True]  # what pretrain-rm reads
    # One judge call per triple, and one more for the reply without a verdict (E), continued from the verdict line.
    assert len(script.requests) == len(CASES) + 1
    [follow_up] = [r for r in script.requests if r["messages"][-1]["role"] == "assistant"]
    assert follow_up["messages"][-1]["content"] == "The completion looks plausible.\n\nFinal Judgment:"


def test_without_a_judge_every_triple_the_verifier_labels_is_kept(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """--without-judge: no generator starts (an unreachable judge would fail the run), and the six triples the
    verifier labels are kept with its label; F, where it finds no answer, is not."""
    assert agreed_label("CORRECT", None) is True and agreed_label("INCORRECT", None) is False
    assert agreed_label("NO_ANSWER", None) is None
    source = tmp_path / "triples.jsonl"
    source.write_text("".join(json.dumps({"question": "What is 2 + 3?", "reference": "5", "completion": c}) + "\n"
                              for c, _ in CASES))
    output = tmp_path / "labelled.jsonl"
    code = main(["annotate", str(source), "-o", str(output), "--chunk-size", "3", "--no-progress", "--without-judge",
                 "generator.assistant.backend=openai", "generator.assistant.base_url=http://127.0.0.1:9/v1"])
    assert code == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert "no judge; 6 written" in printed[0]
    stats = json.loads(printed[-1])
    assert (stats["verifier_labelled"], stats["judge_labelled"], stats["agreed"], stats["disagreed"]) == (6, 0, 6, 0)
    kept = [json.loads(line) for line in output.read_text().splitlines()]
    assert [row["completion"] for row in kept] == [c for c, _ in CASES if "(case F)" not in c]
    assert all(row["judge"] is None for row in kept)
    assert [label for _, label in read_labelled(output)] == [row["verifier"] == "CORRECT" for row in kept]


def test_a_judge_slower_than_the_deadline_is_a_clear_error(tmp_path: Path, chat_server: Any,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    base_url, script = chat_server
    script.reset(default="Final Judgment: Yes", delay_s=3.0)
    source = tmp_path / "triples.jsonl"
    source.write_text(json.dumps({"question": "What is 2 + 3?", "reference": "5", "completion": "\\boxed{5}"}) + "\n")
    code = main(["annotate", str(source), "-o", str(tmp_path / "labelled.jsonl"), "--no-progress",
                 "generator.assistant.backend=openai", f"generator.assistant.base_url={base_url}",
                 "generator.assistant.model_name=judge-7b", "generator.assistant.retries=0",
                 "generator.server.deadline_s=1", "generator.server.unavailable_timeout_s=1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "the generator's judge failed on a chunk of 1 triples (DEADLINE_EXCEEDED" in err
    assert "--chunk-size" in err and "generator.server.deadline_s (now 1 s)" in err and "Traceback" not in err


def test_bad_input_is_refused_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "q", "reference": "1", "completion": "c"}\n{"question": "q", \n')
    assert main(["annotate", str(broken), "-o", str(tmp_path / "out.jsonl")]) == 2
    assert f"{broken}:2: not JSON" in capsys.readouterr().err
    missing = tmp_path / "missing.jsonl"
    missing.write_text('{"question": "q", "completion": "c"}\n')
    with pytest.raises(AnnotationInputError, match=r"missing.jsonl:1: missing 'reference' or 'answer'"):
        read_triples(missing)
    unlabelled = tmp_path / "unlabelled.jsonl"
    unlabelled.write_text('{"question": "q", "reference": "1", "completion": "c", "label": "yes"}\n')
    assert main(["pretrain-rm", str(unlabelled), "-o", str(tmp_path / "model")]) == 2
    assert "unlabelled.jsonl:1: 'label' must be true or false" in capsys.readouterr().err
    assert not (tmp_path / "out.jsonl").exists() and not (tmp_path / "model").exists()

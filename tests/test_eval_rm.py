"""`cooper eval-rm`: VerifyRM (the real loading path, tiny models) and the rule verifier (real math-verify) judged
against human labels on a VerifyBench-format file."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import pytest

from cooper.cli import main
from cooper.config import OptimConfig
from cooper.evaluation.rm_bench import (
    BenchInputError,
    BenchItem,
    auroc,
    read_bench,
    tiny_bench,
    verifier_report,
    write_bench,
)
from cooper.runtime.models import resolve_model
from cooper.services.reward.items import ScoreItem
from cooper.services.reward.verify_rm import VerifyRM

# (answer_type, reference, completion, gold_correct, what real math-verify says)
ROWS = [
    ("Numerical Values", "12", "We get 3*4 = 12. The answer is \\boxed{12}.", True, "CORRECT"),
    ("Numerical Values", "12", "So \\boxed{13}.", False, "INCORRECT"),
    ("Numerical Values", "\\frac{1}{2}", "Half of it: \\boxed{0.5}", True, "CORRECT"),
    ("Numerical Values", "12", "The total is twelve.", True, "NO_ANSWER"),  # right, in a form the rules miss
    ("Expressions", "(x+1)^2", "Expanding, \\boxed{x^2+2x+1}", True, "CORRECT"),
    ("Expressions", "(x+1)^2", "I think it is \\boxed{(x+1)^3}", False, "INCORRECT"),
]


def _write_rows(path: Path) -> list[BenchItem]:
    rows = [{"question_id": k, "question": f"Problem {k}?", "answer": ref, "completion": completion,
             "gold_correct": gold, "answer_type": answer_type, "completion_model": "m"}
            for k, (answer_type, ref, completion, gold, _) in enumerate(ROWS)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return read_bench(path)


def _last_json(out: str) -> dict:
    return json.loads(out.strip().splitlines()[-1])


def test_auroc_counts_pairs_ranked_right_with_ties_as_half() -> None:
    rng = random.Random(0)
    scores = [rng.choice([0.1, 0.2, 0.5, 0.7, 0.9]) for _ in range(40)]  # many ties
    labels = [rng.random() < 0.4 for _ in range(40)]
    pairs = [(p, n) for p, n in itertools.product(range(40), range(40)) if labels[p] and not labels[n]]
    brute = sum(1.0 if scores[p] > scores[n] else 0.5 if scores[p] == scores[n] else 0.0 for p, n in pairs)
    assert auroc(scores, labels) == pytest.approx(brute / len(pairs))
    assert auroc([0.1, 0.2, 0.9], [False, False, True]) == 1.0
    assert auroc([0.9, 0.2, 0.1], [False, False, True]) == 0.0
    assert auroc([0.5, 0.5], [True, False]) == 0.5
    assert auroc([0.3, 0.4], [True, True]) is None  # one class only: undefined, not 0 or 1


def test_eval_rm_reports_both_judges_per_answer_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = tmp_path / "verifybench.jsonl"
    items = _write_rows(bench)
    report_path = tmp_path / "out" / "report.json"
    code = main(["eval-rm", str(bench), "-o", str(report_path), "reward.model=tiny", "reward.device=cpu",
                 "reward.torch_threads=1", "verifier.workers=1"])
    assert code == 0
    out = capsys.readouterr().out
    report = _last_json(out)
    assert json.loads(report_path.read_text()) == report  # -o holds the same JSON as the last line
    assert "answer type" in out and "Expressions" in out and "VerifyRM AUROC" in out

    # The verifier: real math-verify verdicts; the "twelve" completion is right but has no answer it can parse.
    verifier = report["verifier"]
    assert verifier["verdicts"] == {"CORRECT": 3, "INCORRECT": 2, "NO_ANSWER": 1}
    assert verifier["accuracy"] == pytest.approx(5 / 6)
    assert verifier["by_type"] == {"Expressions": {"n": 2, "accuracy": 1.0},
                                   "Numerical Values": {"n": 4, "accuracy": 0.75}}
    assert verifier["auroc"] is None

    # VerifyRM: the same numbers as scoring the file with the model loaded by hand, thresholded at 0.5.
    rm = VerifyRM.load(resolve_model("tiny", "reward"), OptimConfig(), device="cpu")
    scores = [s for s, _ in rm.score([ScoreItem(i.question, i.reference, i.completion) for i in items])]
    said = [s > 0.5 for s in scores]
    rm_report = report["verifyrm"]
    assert rm_report["accuracy"] == pytest.approx(sum(s == i.gold_correct for s, i in zip(said, items, strict=True)) / 6)
    assert rm_report["says_correct"] == pytest.approx(sum(said) / 6)
    assert rm_report["auroc"] == pytest.approx(auroc(scores, [i.gold_correct for i in items]))
    assert {t: c["n"] for t, c in rm_report["by_type"].items()} == {"Expressions": 2, "Numerical Values": 4}
    assert (report["n"], report["gold_correct"], report["reward_model"]) == (6, 4, "tiny")


def test_pretrained_tiny_rm_tells_right_from_wrong_on_the_tiny_benchmark(
        capsys: pytest.CaptureFixture[str]) -> None:
    # tiny-rm (the tiny VerifyRM that compares with the reference, BCE-pretrained on right, wrong and answer-less solutions) on problems it
    # never saw; the verifier gets every one of them right, since each carries a \boxed answer or none at all.
    # tiny-rm is a deliberately small-budget proxy (warm_start.RM_PROBLEMS): it ranks above chance (measured AUROC
    # 0.745 on v7's two-step problems, 0.8+ on v6's; docs/experiments.md says why) but thresholds worse, so that is
    # what is asserted, not a verifier's accuracy.
    assert main(["eval-rm", "tiny", "reward.model=tiny-rm", "reward.device=cpu", "reward.torch_threads=1",
                 "verifier.workers=1"]) == 0
    report = _last_json(capsys.readouterr().out)
    assert report["reward_model"] == "tiny-rm" and report["n"] == 96
    assert report["verifier"]["accuracy"] == 1.0
    assert report["verifyrm"]["auroc"] > 0.7
    assert report["verifyrm"]["accuracy"] > 0.6
    assert set(report["verifyrm"]["by_type"]) == {"right", "wrong number", "no answer"}


def test_tiny_benchmark_round_trips_and_mixes_kinds(tmp_path: Path) -> None:
    items = tiny_bench(60, seed=2)
    assert items == tiny_bench(60, seed=2) and items != tiny_bench(60, seed=3)
    kinds = {kind: [i for i in items if i.answer_type == kind] for kind in ("right", "wrong number", "no answer")}
    assert all(kinds.values())
    assert all(i.gold_correct for i in kinds["right"]) and not any(i.gold_correct for i in kinds["wrong number"])
    write_bench(tmp_path / "tiny.jsonl", items)
    assert read_bench(tmp_path / "tiny.jsonl") == items
    # Labels agree with what a rule verifier would say on this easy task.
    assert verifier_report(items, ["CORRECT" if i.gold_correct else "INCORRECT" for i in items]).accuracy == 1.0


@pytest.mark.parametrize(("line", "message"), [
    ("{not json", "bench.jsonl:2: not JSON"),
    ('{"question": "q", "answer": "1", "completion": "c"}', "bench.jsonl:2: field 'gold_correct' must be true or "
                                                           "false (missing)"),
    ('{"question": "q", "answer": "1", "completion": "c", "gold_correct": "yes"}', 'false (got "yes")'),
    ('{"question": "q", "completion": "c", "gold_correct": true}', "bench.jsonl:2: missing field 'answer' or "
                                                                  "'reference' or 'target'"),
    ('{"question": "q", "answer": 12, "completion": "c", "gold_correct": true}', "field 'answer' must be a string"),
    ('[1, 2]', "bench.jsonl:2: expected a JSON object, got list"),
])
def test_bad_benchmark_lines_fail_naming_file_line_and_field(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                             line: str, message: str) -> None:
    bench = tmp_path / "bench.jsonl"
    good = {"question": "q", "target": "1", "completion": "\\boxed{1}", "gold_correct": True}  # `target` is read
    bench.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(BenchInputError, match="bench.jsonl"):
        read_bench(bench)
    assert main(["eval-rm", str(bench), "reward.model=tiny"]) == 2  # before any model is loaded
    assert message in capsys.readouterr().err


def test_missing_or_empty_benchmark_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval-rm", str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl: no such file" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n")
    assert main(["eval-rm", str(tmp_path / "empty.jsonl")]) == 2
    assert "empty.jsonl: no items in the file" in capsys.readouterr().err


def test_eval_rm_through_running_services_reports_what_it_reports_in_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], verifier_address: str) -> None:
    # The running reward service pays the discrete reward (0 or 1): the report must rank VerifyRM's probabilities
    # all the same, and the verifier service must judge as the in-process pool does (an answer outside a box is no
    # answer under verifier.answer=boxed, on both paths).
    from cooper.runtime.processes import start_service

    bench = tmp_path / "verifybench.jsonl"
    _write_rows(bench)
    judged = ["reward.model=tiny", "reward.discrete=true", "verifier.answer=boxed"]
    assert main(["eval-rm", str(bench), *judged, "reward.device=cpu", "reward.torch_threads=1",
                 "verifier.workers=1"]) == 0
    here = _last_json(capsys.readouterr().out)
    reward = start_service("reward", overrides=[*judged, "reward.device=cpu", "reward.torch_threads=1",
                                                "reward.http.enabled=false", "reward.server.metrics_port=null",
                                                f"reward.checkpoint_dir={tmp_path / 'ckpt'}"])
    try:
        assert main(["eval-rm", str(bench), *judged, f"reward.server.address={reward.address}",
                     f"verifier.server.address={verifier_address}"]) == 0
    finally:
        reward.stop()
    remote = _last_json(capsys.readouterr().out)
    assert remote["reward_version"] == 0 and here["reward_version"] is None
    assert remote["verifyrm"] == here["verifyrm"] and remote["verifier"] == here["verifier"]
    # Ranked by probabilities: the service's 0/1 rewards (the tiny RM accepts none of these six) would tie every
    # item, an AUROC of exactly 0.5, where the probabilities rank them.
    assert here["verifyrm"]["says_correct"] == 0.0 and here["verifyrm"]["auroc"] != 0.5
    # "Half of it: \boxed{0.5}" is right; "The total is twelve." has no box: NO_ANSWER under boxed as before.
    assert here["verifier"]["verdicts"]["NO_ANSWER"] == 1

"""`cooper experiment`'s comparison outputs, on records shaped like real runs' metrics."""

import subprocess
import sys

from cooper.orchestrator.experiment import compare_plot, compare_table


def _records(mode: str, rewards: list[float]) -> list[dict]:
    out = []
    for step, reward in enumerate(rewards):
        record = {"step": step, "mode": mode, "reward_mean": reward, "verifier_accuracy": 0.3}
        if mode != "rule":
            record["rm_verifier_disagreement"] = reward - 0.3
        if step == len(rewards) - 1:
            record["test/gsm8k"] = 0.5
        out.append(record)
    return out


def test_compare_table_and_plot(tmp_path):
    runs = {"rule": _records("rule", [0.3, 0.3]), "static": _records("static", [0.5, 0.9]),
            "cooper": _records("cooper", [0.5, 0.6])}
    table = compare_table(runs).splitlines()
    assert table[0].split() == ["mode", "reward_mean", "verifier_accuracy", "rm_verifier_disagreement", "test/gsm8k"]
    assert table[1].split() == ["rule", "0.300", "0.300", "-", "0.500"]
    assert table[2].split() == ["static", "0.900", "0.300", "0.600", "0.500"]  # the last step's values
    path = compare_plot(runs, tmp_path / "compare.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000


def test_experiment_rejects_unknown_modes():
    result = subprocess.run([sys.executable, "-m", "cooper.cli", "experiment", "--modes", "rule,greedy"],
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--modes takes rule, static and cooper" in result.stderr

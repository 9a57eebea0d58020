"""The README's first command as a user types it: `cooper` (the installed script) from a new empty directory, with
the default relative output directory (`run.output_dir: runs`). Every other test passes absolute temp paths, which
is how a relative run directory once broke the embedded Redis (it changes into `--dir` before it binds its socket)
while the whole suite stayed green."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

COOPER = Path(sys.executable).parent / "cooper"


def _cooper(cwd: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    assert COOPER.is_file(), f"{COOPER} not found: install the project (pip install --no-deps -e .) as README says"
    return subprocess.run([str(COOPER), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def _only_run(cwd: Path) -> Path:
    runs = [p for p in (cwd / "runs").iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run directory under {cwd / 'runs'}, found {runs}"
    return runs[0]


@pytest.mark.slow
def test_cooper_train_from_an_empty_directory(tmp_path):
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    result = _cooper(cwd, "train", "run.steps=3", "--no-progress", timeout_s=600)
    assert result.returncode == 0, result.stderr[-4000:]
    run_dir = _only_run(cwd)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (run_dir / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (run_dir / "redis" / "redis.log").is_file()  # the embedded Redis ran in the run's own directory
    assert not (cwd / "runs" / "redis").exists() and not list(cwd.glob("*.sock"))


@pytest.mark.slow
def test_cooper_experiment_from_an_empty_directory(tmp_path):
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    result = _cooper(cwd, "experiment", "--modes", "rule,static", "--best-of-n", "2", "--no-progress",
                     "run.steps=2", "run.name=first", timeout_s=600)
    assert result.returncode == 0, result.stderr[-4000:]
    out = cwd / "runs" / "first"
    verdict = json.loads((out / "results.json").read_text())
    assert verdict["modes"] == ["rule", "static"]
    assert all(Path(p).is_absolute() and (Path(p) / "metrics.jsonl").is_file() for p in verdict["run_dirs"].values())
    for picture in ("compare.png", "overoptimization.png", "rm_health.png"):
        assert (out / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
    # The verdict is computed from the runs (two steps reproduce nothing: a mode that did not run fails its
    # criteria), and the best-of-n baseline and the exploit report come from the initial models.
    (seed,) = verdict["seeds"]
    assert verdict["reproduced"] is False and verdict["benchmark"] == "heldout"  # judged on the held-out set
    assert {(s["mode"], s["seed"]) for s in verdict["runs"]} == {("rule", seed), ("static", seed)}
    assert verdict["criteria"][str(seed)]["cooper_keeps_up_with_rule"] is False
    # It says which of cooper's recipes its `cooper` is: the preset's (configs/tiny.yaml).
    assert verdict["judged_recipe"] == {**verdict["judged_recipe"], "label": "cooper", "negatives": "both",
                                        "generator": "varied", "lr": 5e-4}
    assert len(json.loads((out / "best_of_n.json").read_text())["curve"]) >= 2
    assert (out / "exploits.md").read_text().startswith("#")

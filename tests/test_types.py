"""The seams type-check: mypy (pinned in the dev lock, configured in pyproject.toml's [tool.mypy]) finds no error in
the orchestrator, the launcher, the runtime and the services' clients, in-process faces and messages, so the stages
call each service only through what its protocol (orchestrator/services.py) promises and every face keeps it; and an
error planted at one of those seams fails the check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("mypy", reason="mypy comes with the dev extra")


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    """mypy as configured in pyproject.toml (its files, its cache under .pytest_cache), from the checkout's root."""
    return subprocess.run([sys.executable, "-m", "mypy", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_the_seams_type_check_and_a_planted_error_fails(tmp_path):
    clean = mypy()
    assert clean.returncode == 0, f"mypy found errors:\n{clean.stdout}{clean.stderr}"
    assert "Success: no issues found" in clean.stdout

    # The run's checkpoint calls the policy service's save by a keyword its protocol does not have: as a run would
    # only find out at its first checkpoint, minutes in.
    run_py = ROOT / "cooper" / "orchestrator" / "run.py"
    source = run_py.read_text()
    assert source.count("self.ctx.policy.save(tag=") == 1
    planted = tmp_path / "run.py"
    planted.write_text(source.replace("self.ctx.policy.save(tag=", "self.ctx.policy.save(label="))
    broken = mypy("--shadow-file", str(run_py), str(planted))
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert 'run.py' in broken.stdout and 'Unexpected keyword argument "label" for "save" of "Policy"' in broken.stdout

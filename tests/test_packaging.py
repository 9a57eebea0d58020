"""The presets ship with the package: a wheel built from the checkout holds every `configs/*.yaml` as
`cooper/configs/`, and the package, unpacked from it and run from an empty directory, finds the embedded default
there. Built offline (`--no-build-isolation --no-index`) from a copy of what the build reads, so the checkout gets no
`build/` directory."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BUILD_INPUTS = ["pyproject.toml", "setup.py", "README.md", "LICENSE"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in BUILD_INPUTS:
        shutil.copy2(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
    shutil.copytree(ROOT / "cooper", source / "cooper", ignore=ignore)
    shutil.copytree(ROOT / "configs", source / "configs", ignore=ignore)
    out = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "-q", "-w", str(out), str(source)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    (path,) = out.glob("cooper_rl-*.whl")
    return path


def test_the_wheel_holds_every_preset(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    presets = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
    assert "tiny.yaml" in presets
    assert [p for p in presets if f"cooper/configs/{p}" not in names] == []
    assert {"cooper/cli.py", "cooper/protos/reward/v1/reward.proto"} <= names
    assert any(name.endswith(".dist-info/licenses/LICENSE") for name in names), "the license text is not in the wheel"


def test_the_wheel_holds_the_shipped_tiny_models(wheel):
    from cooper.tiny.models import SHIPPED

    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = [p.relative_to(ROOT).as_posix() for p in SHIPPED.rglob("*") if p.is_file()]
    assert any(p.endswith("policy-sft/model.safetensors") for p in shipped)
    assert [p for p in shipped if p not in names] == []


def test_the_installed_package_finds_the_default_preset_from_an_empty_directory(wheel, tmp_path):
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    # On sys.path ahead of the checkout (an editable install's finder comes after it), as a wheel install would be.
    probe = ("import cooper, cooper.cli; from cooper.config import load_config; "
             "print(cooper.__file__); print(cooper.config.preset_path('tiny')); "
             "print(load_config(cooper.config.preset_path('tiny'), [], environ={}).data.preset)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=empty, timeout=60,
                            env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    module, preset, data = result.stdout.split()
    assert Path(module).is_relative_to(site) and Path(preset) == site / "cooper" / "configs" / "tiny.yaml"
    assert data == "tiny"

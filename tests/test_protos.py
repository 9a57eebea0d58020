"""The committed stubs must be exactly what the pinned grpcio-tools makes of the .proto files."""

import filecmp
from pathlib import Path

import pytest

from cooper.protos import generate

pytest.importorskip("grpc_tools", reason="grpcio-tools comes with the dev extra")


def test_stubs_match_protos(tmp_path):
    written = generate.generate(tmp_path)
    assert written, "no stubs generated"
    root = generate.PROTO_ROOT
    committed = sorted(p for p in (root / "cooper" / "protos").rglob("*_pb2*.py*") if p.suffix in (".py", ".pyi"))
    fresh = {p.relative_to(tmp_path) for p in written}
    assert {p.relative_to(root) for p in committed} == fresh, "stub files missing or extra: run python -m cooper.protos.generate"
    drifted = [str(rel) for rel in fresh if not filecmp.cmp(tmp_path / rel, root / rel, shallow=False)]
    assert not drifted, f"stubs drifted from .proto files: {drifted}; run python -m cooper.protos.generate"


def test_every_service_has_versioned_package():
    packages = {}
    for proto in Path(generate.PROTO_ROOT, "cooper", "protos").rglob("*.proto"):
        line = next(ln for ln in proto.read_text().splitlines() if ln.startswith("package "))
        packages[proto.stem] = line.split()[1].rstrip(";")
    assert packages == {
        "common": "cooper.common.v1",
        "verifier": "cooper.verifier.v1",
        "reward": "cooper.reward.v1",
        "policy": "cooper.policy.v1",
        "generator": "cooper.generator.v1",
    }

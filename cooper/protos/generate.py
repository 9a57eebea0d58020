"""Regenerate the committed gRPC stubs from the .proto files: `python -m cooper.protos.generate`.

Stubs are produced by the grpcio-tools version pinned in pyproject.toml's `dev` extra; tests/test_protos.py
regenerates them into a temp directory and fails when they differ from the committed ones.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

PROTO_ROOT = Path(__file__).resolve().parents[2]  # the directory holding the `cooper` package
PROTOS = sorted((PROTO_ROOT / "cooper" / "protos").rglob("*.proto"))


def generate(out_dir: Path) -> list[Path]:
    """Write *_pb2.py, *_pb2.pyi and *_pb2_grpc.py for every .proto under out_dir; return the files written."""
    import grpc_tools
    from grpc_tools import protoc  # dev extra only

    include = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *[str(p.relative_to(PROTO_ROOT)) for p in PROTOS],
    ]
    if protoc.main(args) != 0:
        raise RuntimeError("protoc failed; see the messages above")
    return sorted(p for p in out_dir.rglob("*_pb2*.py*") if p.suffix in (".py", ".pyi"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=PROTO_ROOT, help="output root (default: the source tree)")
    written = generate(parser.parse_args().out)
    print(f"wrote {len(written)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Writing files so that a crash never leaves half of one: write a temporary file beside it, then rename it into
place (a rename within one directory is atomic). No torch here: the orchestrator, the CLI and the services all use it.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync a file or a directory: a rename is durable only once the directory that holds the name is on disk too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: str | os.PathLike[str], text: str) -> None:
    """`text` (UTF-8) at `path`, all of it or, after a crash, the file as it was: a hidden temporary file beside it,
    then a rename. Creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)

"""Checkpoint writes held by a test (the `hold_checkpoint_writes` fixture, tests/conftest.py)."""

from __future__ import annotations

import threading
from pathlib import Path


class HeldWrites:
    """Checkpoint writes (cooper/runtime/durability.py's, in its background thread) into one directory, held:
    `started` is set when such a write begins, and it goes on once the test sets `release`. Writes anywhere else
    (a reference core's) are not held."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.started, self.release = threading.Event(), threading.Event()

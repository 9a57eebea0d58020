"""Reading JSON Lines files of objects, with errors that name the file and the line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_json_objects(path: str | Path, error: type[Exception] = ValueError) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line; `error` names `path:line` for a line that is not a JSON
    object, so each command raises its own error type for its users."""
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise error(f"{path}:{number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict):
                raise error(f"{path}:{number}: expected a JSON object, got {type(row).__name__}")
            rows.append((number, row))
    return rows

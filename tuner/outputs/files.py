"""Outputs stage, files: the one atomic writer. Everything the tool writes for a person or a
program (result.json, policy.json, reports, CSV) is written beside its final name and renamed,
so a reader, or a killed process, never sees half a file.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_atomic(path: Path, data: str | bytes) -> Path:
    """Write beside the final name, then rename; the temporary file never stays behind."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # gone after a rename; after a failure, not left behind
    return path


def write_json(path: Path, payload: object) -> Path:
    """Indented JSON, atomically; values JSON does not know are written as text."""
    return write_atomic(path, json.dumps(payload, indent=2, default=str))

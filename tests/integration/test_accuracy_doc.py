"""docs/accuracy.md is exactly what its command prints, so no figure in it is hand-copied.

The command re-predicts every stored data set of benchmarks/data (no engine; about 35 s of CPU).
"""

from __future__ import annotations

import difflib
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ".venv/bin/python benchmarks/accuracy_tables.py > docs/accuracy.md"


def test_accuracy_doc_is_what_its_command_prints():
    done = subprocess.run([sys.executable, "benchmarks/accuracy_tables.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"benchmarks/accuracy_tables.py failed:\n{done.stderr[-3000:]}"
    doc = ROOT / "docs" / "accuracy.md"
    held = doc.read_text() if doc.exists() else ""
    if held != done.stdout:
        diff = "".join(difflib.unified_diff(
            held.splitlines(keepends=True), done.stdout.splitlines(keepends=True),
            "docs/accuracy.md", "benchmarks/accuracy_tables.py"))
        pytest.fail(f"docs/accuracy.md is not what its command prints; regenerate it with\n"
                    f"    {COMMAND}\n{diff[:4000]}", pytrace=False)

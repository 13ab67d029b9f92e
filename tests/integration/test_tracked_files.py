"""The tracked files, as `git grep` sees them (a subprocess): none names how the work was
organised."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_no_tracked_file_names_how_the_work_was_organised():
    try:
        out = subprocess.run(
            # Bracketed spaces, so that this line does not match itself.
            ["git", "grep", "-nIE", r"stop[0-9]+|check[ ]session|this[ ]box|carry[ ]list", "--",
             "."],
            cwd=ROOT, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("git is not installed")
    if out.returncode == 128:
        pytest.skip("not a git checkout")
    assert not out.stdout, out.stdout[:2000]

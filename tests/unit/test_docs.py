"""The user-facing texts: a short README that starts with the two commands, docs/ pages that
open with a summary and link back (the tracked files as git sees them:
tests/integration/test_tracked_files.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("method", "accuracy", "gpu", "faults", "fidelity")


def test_readme_is_short_and_opens_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md is {len(lines)} lines; method and evidence go to docs/"
    commands = [ln.strip() for ln in lines if ln.startswith("    scripts/setup.sh")]
    assert len(commands) >= 2
    assert "tuner optimize" in commands[0]
    assert "pytest" in commands[1]


@pytest.mark.parametrize("name", DOCS)
def test_docs_page_opens_with_a_title_and_summary(name):
    text = (ROOT / "docs" / f"{name}.md").read_text()
    lines = text.splitlines()
    assert lines[0].startswith("# ")
    summary = lines[2:5]
    assert all(s.strip() for s in summary), f"docs/{name}.md: a three-line summary under the title"
    assert f"docs/{name}.md" in (ROOT / "README.md").read_text(), "README links every page"


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text()
    for target in re.findall(r"\]\(([^)#]+)\)", text):
        assert (ROOT / target).exists(), target



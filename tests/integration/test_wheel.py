"""The wheel as setuptools builds it from a copy of the checkout (a subprocess, minutes at
most): the root search spaces inside the package, one copy, and the package data beside."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "search_spaces"


def _builtin_yaml() -> list[str]:
    return sorted(p.name for p in SPACES.glob("*.yaml"))


@pytest.mark.skipif(importlib.util.find_spec("setuptools") is None, reason="needs setuptools")
def test_the_wheel_holds_the_root_spaces_inside_the_package(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(ROOT / name, src)
    for name in ("tuner", "search_spaces"):
        shutil.copytree(ROOT / name, src / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "wheel"
    out.mkdir()
    built = subprocess.run(
        [sys.executable, "-c", "import sys; from setuptools import build_meta as b; "
         "print(b.build_wheel(sys.argv[1]))", str(out)],
        cwd=src, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stderr[-2000:]
    with zipfile.ZipFile(out / built.stdout.split()[-1]) as whl:
        names = whl.namelist()
        inside = sorted(n.removeprefix("tuner/search_spaces/") for n in names
                        if n.startswith("tuner/search_spaces/"))
        assert inside == _builtin_yaml()
        for n in inside:
            assert whl.read(f"tuner/search_spaces/{n}") == (SPACES / n).read_bytes()
    assert not any(n.startswith("search_spaces/") for n in names)  # no top-level copy
    data = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tuner" / "data").rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)
    assert sorted(n for n in names if n.startswith("tuner/data/")) == data  # data still ships

"""The built-in search spaces exist once, in the root folder search_spaces/; a wheel installs
them as tuner/search_spaces, and the tuner finds them there, or in the root folder when it runs
from a checkout (an editable install, or `python3 -m tuner` with the checkout on sys.path).
The wheel itself is built in tests/integration/test_wheel.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import tuner
from tuner.errors import ConfigError
from tuner.search import space

ROOT = Path(__file__).resolve().parents[2]
SPACES = ROOT / "search_spaces"
FROM_CHECKOUT = Path(tuner.__file__).resolve().parent == ROOT / "tuner"


def _builtin_yaml() -> list[str]:
    return sorted(p.name for p in SPACES.glob("*.yaml"))


def test_one_copy_of_the_spaces_at_the_root() -> None:
    assert SPACES.is_dir() and not SPACES.is_symlink()
    assert {"default.yaml", "draft.yaml", "ngram.yaml", "suffix.yaml"} <= set(_builtin_yaml())
    assert not (ROOT / "tuner" / "search_spaces").exists()
    skip = {"build", "dist", "__pycache__"}
    found = []
    for here, dirs, _ in os.walk(ROOT):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in skip
                   and not d.endswith(".egg-info")]
        found += [Path(here, d) for d in dirs if d == "search_spaces"]
    assert found == [SPACES]


@pytest.mark.skipif(not FROM_CHECKOUT, reason="tuner is imported from an installed wheel")
def test_builtin_names_resolve_to_the_root_folder_from_a_checkout() -> None:
    assert space.builtin_dir().resolve() == SPACES
    assert space.available() == [Path(n).stem for n in _builtin_yaml()]
    for name in space.available():
        assert space.load(name).methods  # resolves by name, parses


def test_an_installed_package_reads_its_own_copy(tmp_path: Path) -> None:
    wheel = tmp_path / "site-packages"
    (wheel / "tuner" / "search_spaces").mkdir(parents=True)
    (wheel / "search_spaces").mkdir()  # someone else's folder beside it is not read
    assert space.spaces_dir(wheel / "tuner") == wheel / "tuner" / "search_spaces"
    checkout = tmp_path / "checkout"
    (checkout / "tuner").mkdir(parents=True)
    (checkout / "search_spaces").mkdir()
    assert space.spaces_dir(checkout / "tuner") == checkout / "search_spaces"


def test_a_missing_spaces_folder_is_one_clear_error(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    monkeypatch.setattr(space, "builtin_dir", lambda: tmp_path / "gone")
    with pytest.raises(ConfigError, match="built-in search spaces are missing"):
        space.load("ngram")



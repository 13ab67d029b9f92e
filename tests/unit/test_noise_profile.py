"""The host's noise profile (tuner/search/noise_profile.py): a study's repeats are kept per
machine and level, a resumed study replaces its own entry, and a later study starts from the
others'."""

from __future__ import annotations

import pytest

from tuner import intervals
from tuner.search import noise_profile as npf


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEC_TUNER_NOISE_DIR", str(tmp_path / "noise"))


def test_nothing_known_is_the_wide_default():
    assert npf.host_noise("m", 1, study="a", pool=intervals.Pool()) == npf.DEFAULT


def test_a_study_learns_the_host_and_the_next_one_starts_from_it():
    pool = intervals.Pool.of([[100.0, 104.0], [50.0, 51.0, 49.0]])
    npf.record("m", 1, study="a", pool=pool)
    npf.record("m", 1, study="a", pool=pool)  # resumed: its entry replaced, not added
    prior = npf.DEFAULT.df  # the default's pseudo-launches count beside what was measured
    own = npf.host_noise("m", 1, study="a", pool=pool)
    assert own.source == "study" and own.df == pool.df + prior == 5
    other = npf.host_noise("m", 1, study="b", pool=intervals.Pool())
    assert other.source == "profile" and other.df == 5
    assert other.sd == pytest.approx(((3 * pool.sd ** 2 + 2 * 0.05 ** 2) / 5) ** 0.5)
    both = npf.host_noise("m", 1, study="b", pool=intervals.Pool.of([[10.0, 10.1]]))
    assert both.df == 6
    assert npf.host_noise("m", 4, study="b", pool=intervals.Pool()) == npf.DEFAULT  # per level
    assert npf.host_noise("other machine", 1, study="b", pool=intervals.Pool()) == npf.DEFAULT


def test_an_unreadable_profile_is_left_alone(tmp_path):
    (tmp_path / "noise").mkdir()
    (tmp_path / "noise" / "m.json").write_text("{not json")
    assert npf.host_noise("m", 1, study="a", pool=intervals.Pool()) == npf.DEFAULT
    npf.record("m", 1, study="a", pool=intervals.Pool.of([[1.0, 1.1]]))
    assert npf.host_noise("m", 1, study="b", pool=intervals.Pool()).df == 1 + npf.DEFAULT.df

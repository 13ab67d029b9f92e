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


def test_only_the_newest_studies_count(monkeypatch):
    """A host that was loaded and is now quiet is judged by what it showed lately: the profile
    pools its newest studies up to WINDOW_DF degrees of freedom and forgets the rest."""
    clock = iter(range(1, 100))
    monkeypatch.setattr(npf.time, "time", lambda: float(next(clock)))
    loud = intervals.Pool.of([[100.0, 130.0, 80.0, 110.0, 95.0]])  # 4 df, ~20%
    quiet = intervals.Pool.of([[100.0, 101.0, 99.0, 100.5, 100.2]])  # 4 df, ~1%
    for n in range(npf.WINDOW_DF // 4):
        npf.record("m", 1, study=f"loud-{n}", pool=loud)
    for n in range(npf.WINDOW_DF // 4):
        npf.record("m", 1, study=f"quiet-{n}", pool=quiet)
    now = npf.host_noise("m", 1, study="new", pool=intervals.Pool())
    assert now.df == npf.WINDOW_DF + npf.DEFAULT.df
    assert now.sd == pytest.approx(((npf.WINDOW_DF * quiet.sd ** 2
                                     + npf.DEFAULT.df * 0.05 ** 2)
                                    / (npf.WINDOW_DF + npf.DEFAULT.df)) ** 0.5)
    assert now.sd < 0.05 < loud.sd
    kept = npf._read("m")["studies"]
    # The file keeps what the newest study's window reaches (its own entry aside): one loud one.
    assert sum(name.startswith("loud") for name in kept) == 1, "older entries are dropped"

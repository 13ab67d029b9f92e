"""The selection over a workload sample (tuner.replay.selection): the rule, the equivalent set,
what keeps a level open, and the interval's coverage over many seeded studies of a scripted
workload whose true speedup is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tuner.outputs import selection as words
from tuner.records.selection import Choice, HostNoise, RestsOn, ThroughputCheck, Undecided
from tuner.replay import forecast
from tuner.replay.forecast import LevelForecast
from tuner.replay.selection import MODEL_SD, accuracy, choice, cost_error, select

HOST = HostNoise(sd=0.02, df=30, source="profile")


def _level(speedups: dict[str, float], *, n: int = 64, spread: float = 0.05, seed: int = 0,
           c: int = 1) -> LevelForecast:
    """A sample of n prompts: the baseline's share of each prompt drawn at random, each
    config's shares the baseline's over its speedup, with a per-prompt spread (lognormal)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(500, 2000, n)
    rows = [base / s * np.exp(rng.normal(0, spread, n)) for s in speedups.values()]
    return LevelForecast(concurrency=c, keys=tuple(speedups), labels=tuple(speedups),
                         base_share_ms=base, share_ms=np.asarray(rows))


def _check(label: str, residual: float = 0.0, *, missed: bool = False) -> ThroughputCheck:
    """A launch of `label` whose measured throughput is exp(residual) times its prediction."""
    predicted, measured = 100.0, 100.0 * math.exp(residual)
    return ThroughputCheck(label=label, concurrency=1, predicted=predicted, measured=measured,
                           error_pct=100 * (predicted - measured) / measured, accuracy_pct=5.0,
                           missed=missed)


def test_the_rule_on_off_undecided():
    assert choice(1.05, 1.30, 0.02) == Choice.ON
    assert choice(0.95, 1.01, 0.02) == Choice.OFF
    assert choice(1.001, 1.015, 0.02) == Choice.OFF  # a real gain smaller than the zone
    assert choice(0.97, 1.10, 0.02) == Choice.UNDECIDED


def test_a_clear_winner_launched_is_on_and_its_twins_are_one_choice():
    level = _level({"a": 2.0, "twin": 1.99, "far": 1.4})
    counts = forecast.resample_counts(64, draws=500, seed=1)
    sel = select(level, counts, host=HOST, checks=[_check("a", 0.01), _check("twin", -0.01)])
    assert sel.choice == Choice.ON and sel.subject in ("a", "twin")
    assert sel.lo > 1.0 and sel.lo < sel.speedup < sel.hi
    other = "twin" if sel.subject == "a" else "a"
    assert other in sel.equivalent and "far" not in sel.equivalent
    assert sel.launched and sel.rests_on == RestsOn.SCALED  # its own launch scales it
    own = 0.01 if sel.subject == "a" else -0.01
    assert sel.scale == pytest.approx(math.exp(own))
    assert sel.cost_sd == pytest.approx(HOST.sd * math.sqrt(2))  # one launch each
    assert "scaled by" in words.answer_text(sel)


def test_a_subject_never_launched_is_not_turned_on():
    level = _level({"a": 2.0, "b": 1.5})
    sel = select(level, forecast.resample_counts(64, draws=300, seed=1), host=HOST)
    assert sel.choice == Choice.UNDECIDED and sel.undecided == Undecided.UNLAUNCHED
    assert words.headline(sel).split(": ")[1] == "Undecided"


def test_nothing_beats_the_baseline_by_the_zone_is_off():
    level = _level({"a": 0.8, "b": 0.85}, spread=0.01)
    sel = select(level, forecast.resample_counts(64, draws=300, seed=1), host=HOST,
                 checks=[_check("other"), _check("other2", 0.01)])
    assert sel.choice == Choice.OFF and sel.hi < 1.02


def test_a_gain_at_the_zone_edge_stays_open_and_says_what_decides_it():
    level = _level({"a": 1.03}, spread=0.01)
    sel = select(level, forecast.resample_counts(64, draws=300, seed=1),
                 host=HostNoise(sd=0.02, df=2, source="default"), checks=[_check("a")])
    assert sel.choice == Choice.UNDECIDED and sel.undecided == Undecided.COST
    assert "Undecided" in words.headline(sel)


def test_a_launch_that_misses_the_forecast_moves_the_answer_to_the_launches():
    from tuner import intervals

    level = _level({"a": 2.0})
    measured = {"a": intervals.Interval(point=1.2, lo=0.9, hi=1.6, confidence=0.95, n_a=1,
                                        n_b=2, df=3)}
    sel = select(level, forecast.resample_counts(64, draws=300, seed=1), host=HOST,
                 checks=[_check("a", -0.5, missed=True)], measured=measured)
    assert sel.rests_on == RestsOn.MEASURED and sel.speedup == 1.2
    assert sel.choice == Choice.UNDECIDED  # the launches' interval holds 1.00x
    assert "on the launches alone" in words.answer_text(sel)
    assert "no number of launches" not in words.answer_text(sel)  # launches narrow it
    assert "narrow the launches' interval" in words.answer_text(sel)
    # One launch each, no spread yet: no interval, and a repeat is what decides.
    bare = select(level, forecast.resample_counts(64, draws=300, seed=1), host=HOST,
                  checks=[_check("a", -0.5, missed=True)])
    assert bare.rests_on == RestsOn.MEASURED and (bare.lo, bare.hi) == (None, None)
    assert bare.choice == Choice.UNDECIDED and bare.launches_to_decide == 1
    assert "no interval yet" in words.headline(bare)


def test_cost_error_pools_residuals_with_the_hosts_spread():
    prior = math.sqrt(2 * 0.02 ** 2 + MODEL_SD ** 2)  # two launches' noise, the model's own
    sd, df = cost_error([], HostNoise(sd=0.02, df=10, source="profile"))
    assert df == 10 and sd == pytest.approx(prior)
    sd, df = cost_error([0.2] * 10, HostNoise(sd=0.02, df=10, source="profile"))
    assert df == 20 and sd > 0.1  # a model that misses by 20% is not hidden by a quiet host
    assert accuracy(HOST, 0.95) == pytest.approx(2.042 * prior, rel=1e-3)


@pytest.mark.parametrize("lo,hi", [(0.8, 0.99), (0.95, 1.0), (0.99, 1.5), (1.0, 1.2),
                                   (1.001, 1.2), (1.0, 1.01), (1.2, 1.4)])
def test_no_output_says_turn_on_where_the_interval_holds_one(lo, hi):
    level = _level({"a": 1.1})
    sel = select(level, forecast.resample_counts(64, draws=50, seed=0), host=HOST,
                 checks=[_check("a")])
    sel = sel.model_copy(update={"lo": lo, "hi": hi, "speedup": (lo + hi) / 2,
                                 "choice": choice(lo, hi, 0.02)})
    said = words.headline(sel) + words.answer_text(sel)
    assert ("Turn on" in said) == (lo > 1.0 and hi >= 1.02)
    assert (words.confidence(sel) == "undecided") == (sel.choice == Choice.UNDECIDED)


def test_the_interval_covers_the_true_speedup_over_many_seeded_studies():
    # The workload: 2000 prompts whose true speedup under config "a" is known; each study sees
    # a sample of 64 of them, a fitted step cost off by a launch's noise (3%), and two
    # out-of-fit launches whose residuals carry that error. The stated 95% interval must cover
    # the population's speedup in at least 90% of studies.
    rng = np.random.default_rng(7)
    pop_base = rng.uniform(500, 2000, 2000)
    pop_a = pop_base / 1.6 * np.exp(rng.normal(0, 0.25, 2000))
    truth = pop_base.sum() / pop_a.sum()
    covered, widths = 0, []
    for seed in range(200):
        r = np.random.default_rng(seed)
        idx = r.choice(2000, 64, replace=False)
        bias = r.normal(0, 0.03)  # the cost model's error in this study
        level = LevelForecast(concurrency=1, keys=("a",), labels=("a",),
                              base_share_ms=pop_base[idx],
                              share_ms=(pop_a[idx] * math.exp(-bias))[None, :])
        checks = [_check(f"launch {i}", bias + r.normal(0, 0.02)) for i in range(2)]
        sel = select(level, forecast.resample_counts(64, draws=400, seed=seed),
                     host=HostNoise(sd=0.02, df=20, source="profile"), checks=checks,
                     launched={"a"})
        covered += sel.lo <= truth <= sel.hi
        widths.append(sel.hi / sel.lo)
    assert covered >= 180, covered
    assert np.median(widths) < 1.6


def test_a_subject_scaled_to_its_own_launch_covers_the_truth_and_is_narrower():
    # As above, but the subject itself was launched: its forecast is scaled by its own launch
    # (the model's error, 8% here, removed; the launch's and the baseline's noise, 2% each,
    # left). Coverage holds at 95% and the interval is narrower than on the prior alone.
    rng = np.random.default_rng(11)
    pop_base = rng.uniform(500, 2000, 2000)
    pop_a = pop_base / 1.6 * np.exp(rng.normal(0, 0.25, 2000))
    truth = pop_base.sum() / pop_a.sum()
    host = HostNoise(sd=0.02, df=20, source="profile")
    covered, scaled, prior = 0, [], []
    for seed in range(200):
        r = np.random.default_rng(seed)
        idx = r.choice(2000, 128, replace=False)
        bias = r.normal(0, 0.08)
        level = LevelForecast(concurrency=1, keys=("a",), labels=("a",),
                              base_share_ms=pop_base[idx],
                              share_ms=(pop_a[idx] * math.exp(-bias))[None, :])
        counts = forecast.resample_counts(128, draws=400, seed=seed)
        own = _check("a", -bias + r.normal(0, 0.02) - r.normal(0, 0.02))  # measured / forecast
        sel = select(level, counts, host=host, checks=[own], launched={"a"})
        assert sel.rests_on == RestsOn.SCALED and sel.scale_launches == (1, 1)
        covered += sel.lo <= truth <= sel.hi
        scaled.append(sel.hi / sel.lo)
        bare = select(level, counts, host=host, launched={"a"})
        prior.append(bare.hi / bare.lo)
    assert covered >= 180, covered
    assert np.median(scaled) < np.median(prior)


def test_undecided_when_scaled_counts_the_launches_that_would_close_it():
    level = _level({"a": 1.06}, spread=0.005, n=128)
    sel = select(level, forecast.resample_counts(128, draws=300, seed=1),
                 host=HostNoise(sd=0.03, df=12, source="profile"), checks=[_check("a")])
    assert sel.rests_on == RestsOn.SCALED and sel.choice == Choice.UNDECIDED
    assert sel.undecided == Undecided.COST and sel.launches_to_decide is not None


def test_a_launched_twin_of_the_best_forecast_answers_for_it_and_nothing_more_is_launched():
    level = _level({"best": 2.0, "twin": 1.995, "far": 1.4}, seed=3)
    counts = forecast.resample_counts(64, draws=500, seed=1)
    sel = select(level, counts, host=HOST, checks=[_check("twin", 0.01)])
    assert sel.subject == "twin" and sel.launched and "best" in sel.equivalent
    alone = select(level, counts, host=HOST, checks=[_check("far", 0.01)])
    assert alone.subject == "best" and not alone.launched  # far is no twin: best is launched

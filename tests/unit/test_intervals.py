"""tuner.intervals: Student's t against its table, the pooled spread, speedup intervals and
the decision they support, on hand-checked numbers."""

from __future__ import annotations

import math
import statistics

import pytest

from tuner import intervals
from tuner.intervals import Interval, Pool, decide, speedup, t_cdf, t_quantile

# Two-sided table values (any statistics textbook): (p, df) -> t_p,df to 3 decimals.
T_TABLE = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 3): 3.182, (0.975, 4): 2.776,
           (0.975, 6): 2.447, (0.975, 10): 2.228, (0.975, 30): 2.042, (0.95, 1): 6.314,
           (0.95, 3): 2.353, (0.95, 10): 1.812, (0.9, 1): 3.078, (0.9, 5): 1.476,
           (0.995, 5): 4.032, (0.995, 20): 2.845, (0.9995, 1): 636.619, (0.6, 7): 0.263}


@pytest.mark.parametrize(("p", "df"), sorted(T_TABLE))
def test_t_quantiles_match_the_table(p, df):
    assert round(t_quantile(p, df), 3) == T_TABLE[p, df]
    assert t_quantile(1 - p, df) == pytest.approx(-t_quantile(p, df))


def test_t_is_exact_where_it_has_a_closed_form_and_tends_to_the_normal():
    # df = 1 is the Cauchy distribution: P(T <= t) = 1/2 + atan(t)/pi.
    for t in (0.3, 1.0, 4.0, 40.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
    # df = 2: P(T <= t) = 1/2 + t / (2 sqrt(2 + t^2)).
    assert t_cdf(1.7, 2) == pytest.approx(0.5 + 1.7 / (2 * math.sqrt(2 + 1.7 ** 2)), abs=1e-12)
    assert t_quantile(0.975, 1e7) == pytest.approx(statistics.NormalDist().inv_cdf(0.975),
                                                   abs=1e-5)
    assert t_quantile(0.5, 3) == 0.0 and t_cdf(0.0, 9) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="p=1"):
        t_quantile(1, 3)


def test_the_spread_is_pooled_over_configs_launched_twice_in_log_space():
    a, b, once = [100.0, 110.0], [50.0, 60.0, 55.0], [70.0]
    pool = Pool.of([a, b, once, [0.0, float("nan")]])  # nothing measured in the last one
    la, lb = [math.log(x) for x in a], [math.log(x) for x in b]
    squares = sum((x - statistics.mean(la)) ** 2 for x in la) + sum(
        (x - statistics.mean(lb)) ** 2 for x in lb)
    assert (pool.df, pool.configs) == (3, 2)
    assert pool.sd == pytest.approx(math.sqrt(squares / 3))
    assert Pool.of([once]) == Pool(sd=0.0, df=0, configs=0)
    assert "pooled over 2 config(s) (3 degrees of freedom)" in pool.text()


def test_a_speedup_interval_from_three_launches_each():
    base, fast = [100.0, 102.0, 98.0], [121.0, 119.0, 123.0]
    pool = Pool.of([base, fast])
    iv = speedup(fast, base, pool=pool)
    diff = statistics.mean(map(math.log, fast)) - statistics.mean(map(math.log, base))
    half = 2.776 * pool.sd * math.sqrt(1 / 3 + 1 / 3)  # df 4
    assert iv.point == pytest.approx(math.exp(diff))
    assert iv.lo == pytest.approx(math.exp(diff - half), rel=1e-4)
    assert iv.hi == pytest.approx(math.exp(diff + half), rel=1e-4)
    assert (iv.n_a, iv.n_b, iv.df, iv.confidence) == (3, 3, 4, 0.95)
    assert iv.text() == f"1.21x (95% interval {iv.lo:.2f}-{iv.hi:.2f}; 3 and 3 launches)"
    assert iv.text() == "1.21x (95% interval 1.16-1.26; 3 and 3 launches)"
    # A higher confidence widens it; the point stays.
    wide = speedup(fast, base, pool=pool, confidence=0.99)
    assert wide.point == iv.point and wide.lo < iv.lo and wide.hi > iv.hi
    assert wide.bounds().startswith("99% interval")


def test_one_launch_borrows_the_pool_only_once_it_has_two_degrees_of_freedom():
    base, once = [100.0, 104.0], [130.0]
    assert speedup(once, base, pool=Pool.of([base, once])) is None  # df 1
    assert intervals.enough(2, Pool.of([base])) and not intervals.enough(1, Pool.of([base]))
    pool = Pool.of([base, [90.0, 92.0], once])  # df 2 from the others
    iv = speedup(once, base, pool=pool)
    assert iv is not None and (iv.n_a, iv.n_b, iv.df) == (1, 2, 2)
    assert speedup([], base, pool=pool) is None
    assert not intervals.enough(5, Pool())  # nothing pooled: no interval at all


def _iv(lo: float, hi: float) -> Interval:
    return Interval(point=(lo + hi) / 2, lo=lo, hi=hi, confidence=0.95, n_a=3, n_b=3, df=4)


@pytest.mark.parametrize(("lo", "hi", "margin", "want"), [
    (1.01, 1.20, 0.02, "above"),
    (1.005, 1.015, 0.02, "equivalent"),  # above 1, but by less than the margin
    (1.005, 1.025, 0.02, "above"),
    (1.0003, 1.0003, 0.02, "equivalent"),  # identical launches: no spread, no difference
    (0.80, 0.99, 0.02, "below"),
    (0.985, 1.01, 0.02, "equivalent"),
    (0.98, 1.02, 0.02, "equivalent"),  # the band's edges belong to it
    (0.97, 1.01, 0.02, "open"),
    (0.97, 1.01, 0.05, "equivalent"),
    (0.999, 1.001, 0.0, "open"),  # no band: only above or below decide
])
def test_decide_reads_the_interval_against_one_and_the_margin(lo, hi, margin, want):
    assert decide(_iv(lo, hi), margin) == want


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="confidence"):
        speedup([1.0, 2.0], [1.0, 2.0], pool=Pool(sd=0.1, df=2, configs=1), confidence=95)
    with pytest.raises(ValueError, match="margin"):
        decide(_iv(0.9, 1.1), -0.01)
    assert intervals.percent(0.95) == "95%" and intervals.percent(0.995) == "99.5%"


# --- the paired within-level spread ------------------------------------------------------------
def test_paired_windows_give_the_spread_of_the_per_window_log_ratio():
    # Window j of every launch holds the same requests (digest "d"): A is 2x, 2.2x and 1.8x
    # the baseline on the three windows, over two launches of each.
    base = [("d", (10.0, 20.0, 30.0)), ("d", (10.0, 20.0, 30.0))]
    a = [("d", (20.0, 44.0, 54.0)), ("d", (20.0, 44.0, 54.0))]
    within = intervals.Within.paired(a, base)
    diffs = [math.log(2.0), math.log(2.2), math.log(1.8)]
    mean = sum(diffs) / 3
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2)
    assert within is not None and within.df == 2
    assert within.se == pytest.approx(sd / math.sqrt(3))
    # Equal ratios in every window: nothing moves within the level.
    same = intervals.Within.paired([("d", (20.0, 40.0, 60.0))], base)
    assert same is not None and same.se == pytest.approx(0.0, abs=1e-12)


def test_windows_pair_only_on_the_same_requests_and_the_same_cut():
    base = [("d", (10.0, 20.0, 30.0))]
    assert intervals.Within.paired([("other", (20.0, 44.0, 54.0))], base) is None
    assert intervals.Within.paired([("d", (20.0, 44.0))], base) is None  # another cut
    assert intervals.Within.paired([(None, (20.0, 44.0, 54.0))], [(None, (1.0, 2.0, 3.0))]) \
        is None  # stored before digests: not known to be paired
    assert intervals.Within.paired([("d", (20.0,))], [("d", (10.0,))]) is None  # one window
    assert intervals.Within.paired([("d", (20.0, math.nan, 5.0))], base) is None
    # Launches on another schedule are left out, the paired ones kept.
    mixed = [("old", (1.0, 1.0, 1.0)), ("d", (20.0, 40.0, 60.0))]
    assert intervals.Within.paired(mixed, base).se == pytest.approx(0.0, abs=1e-12)


def test_the_paired_spread_widens_the_interval_it_is_added_to():
    pool = Pool(sd=0.02, df=4, configs=2)
    a, b = [200.0, 204.0], [100.0, 101.0]
    plain = speedup(a, b, pool=pool)
    wide = speedup(a, b, pool=pool, within=intervals.Within(se=0.05, df=2))
    assert plain is not None and wide is not None and wide.point == plain.point
    assert wide.lo < plain.lo and wide.hi > plain.hi
    # Welch-Satterthwaite: between 2 and 6 degrees of freedom, nearer the noisier source's.
    assert 2 <= wide.df <= 6
    # A within spread of 0, or none at all, leaves the interval as the launches give it.
    assert speedup(a, b, pool=pool, within=intervals.Within(se=0.0, df=2)) == plain
    assert speedup([200.0], [100.0], pool=Pool(), within=intervals.Within(se=0.01, df=2)) is None

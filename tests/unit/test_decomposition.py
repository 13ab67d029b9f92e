"""The split of a speedup over the plain baseline into the engine path's cost and speculation's
own gain: the one arithmetic (tuner.records.speedup.Measured, SpeedupSplit) and where analysis applies
it (tuner.analysis.decomposition: a frame's rows, a recommendation, the policy's ladder)."""

from __future__ import annotations

import math

import pytest

# tests/ holds the shared fakes; it is not a package, so put it on the path explicitly.
from study_fakes import H200_GAIN, H200_PATH, aligned_study, realistic_study

from tuner.analysis import decomposition
from tuner.analysis.frame import trials_frame
from tuner.outputs import policy_words, verdicts
from tuner.records.speedup import Measured, SpeedupSplit, ratio_text, split_text


def m(value: float, spread: float = math.nan) -> Measured:
    return Measured(value=value, relative_spread=spread)


# --- the arithmetic ---------------------------------------------------------------------------
def test_the_split_multiplies_back_to_the_speedup_exactly():
    split = SpeedupSplit.of(m(10.65, 0.01), plain=m(10.1, 0.02), aligned=m(8.3, 0.03))
    assert split.total_speedup.value == 10.65 / 10.1
    assert split.path_cost.value == 8.3 / 10.1
    assert split.speculation_gain.value == 10.65 / 8.3
    assert split.path_cost.value * split.speculation_gain.value == pytest.approx(
        split.total_speedup.value, rel=1e-15)


def test_a_ratio_is_known_no_better_than_its_less_certain_side():
    split = SpeedupSplit.of(m(10.65, 0.01), plain=m(10.1, 0.02), aligned=m(8.3, 0.03))
    assert split.total_speedup.relative_spread == 0.02  # the config's 1%, the plain 2%
    assert split.path_cost.relative_spread == 0.03  # the aligned 3%, the plain 2%
    assert split.speculation_gain.relative_spread == 0.03
    # In the ratio's units: the ratio times its relative spread.
    assert split.path_cost.spread == pytest.approx(0.03 * 8.3 / 10.1)
    # One side measured once: the other side's spread still counts; neither: unknown.
    assert m(2.0).over(m(1.0, 0.04)).relative_spread == 0.04
    assert math.isnan(m(2.0).over(m(1.0)).spread)


def test_no_split_without_both_baselines_and_no_gain_without_a_throughput():
    assert SpeedupSplit.of(m(10.0), plain=m(0.0), aligned=m(8.0)) is None
    assert SpeedupSplit.of(m(10.0), plain=m(10.0), aligned=m(math.nan)) is None
    # The replay's row that the step cost cannot price yet: the path's cost is still known.
    unpriced = SpeedupSplit.of(m(math.nan), plain=m(10.0), aligned=m(8.0))
    assert unpriced.path_cost.value == 0.8
    assert math.isnan(unpriced.speculation_gain.value)
    assert math.isnan(unpriced.total_speedup.value)


def test_the_one_wording_of_a_ratio_and_of_the_split():
    assert ratio_text(1.0654, 0.0213) == "1.07x \u00b10.02"
    assert ratio_text(1.0654) == ratio_text(1.0654, math.nan) == "1.07x"
    assert ratio_text(None) == ratio_text(math.nan, 0.1) == "-"
    split = SpeedupSplit.of(m(10.65, 0.01), plain=m(10.1, 0.02), aligned=m(8.3, 0.03))
    assert str(split) == "path 0.82x \u00b10.02 x speculation 1.28x \u00b10.04"
    assert str(split) == split_text(8.3 / 10.1, 0.03 * 8.3 / 10.1, 10.65 / 8.3,
                                    0.03 * 10.65 / 8.3)


# --- a frame's rows ---------------------------------------------------------------------------
def test_decompose_splits_every_row_with_the_spreads_of_its_repeats():
    df = decomposition.decompose(trials_frame(aligned_study()))
    for c in (1, 8, 32):
        k3 = df[(df["trial"] == 2) & (df["concurrency"] == c)].iloc[0]
        assert k3["path_cost"] == pytest.approx(H200_PATH[c])
        assert k3["speculation_gain"] == pytest.approx(H200_GAIN["k3"][c])
        assert k3["total_speedup"] == pytest.approx(H200_PATH[c] * H200_GAIN["k3"][c])
    done = df[df["total_speedup"].notna()]
    assert len(done) == 4 * 3  # both baselines and both configs, at every level
    assert (done["total_speedup"] - done["path_cost"] * done["speculation_gain"]).abs().max() \
        < 1e-12
    # The aligned baseline over itself: the path cost is its total, the gain 1.
    aligned = done[done["role"] == "aligned_baseline"]
    assert aligned["speculation_gain"].to_numpy() == pytest.approx(1.0)
    # Spreads: the larger relative MAD of the two throughputs, in the ratio's units. The
    # aligned baseline's repeats differ by 3%, the plain one's by 2%, k3's by 1%.
    k3 = df[(df["trial"] == 2) & (df["concurrency"] == 1)].iloc[0]
    assert k3["path_cost_spread"] == pytest.approx(0.03 * H200_PATH[1])
    assert k3["speculation_gain_spread"] == pytest.approx(0.03 * H200_GAIN["k3"][1])
    assert k3["total_speedup_spread"] == pytest.approx(0.02 * k3["total_speedup"])
    # k5 was measured once: its own spread is unknown, the baselines' still count.
    k5 = df[(df["trial"] == 3) & (df["concurrency"] == 1)].iloc[0]
    assert k5["speculation_gain_spread"] == pytest.approx(0.03 * H200_GAIN["k5"][1])
    assert k5["total_speedup_spread"] == pytest.approx(0.02 * k5["total_speedup"])


def test_the_total_is_the_speedup_every_other_table_shows():
    from tuner.analysis.pareto import speedups

    df = trials_frame(aligned_study())
    done = decomposition.decompose(df)
    done = done[done["total_speedup"].notna()]
    assert done["total_speedup"].to_numpy() == pytest.approx(
        speedups(df).loc[done.index, "speedup_throughput"].to_numpy())


def test_without_an_aligned_baseline_no_row_is_split():
    df = trials_frame(realistic_study())
    out = decomposition.decompose(df)
    assert list(out.columns) == [*df.columns, *decomposition.COLUMNS]
    assert out[list(decomposition.COLUMNS)].isna().all().all()
    assert all(decomposition.record(row) is None for _, row in out.iterrows())
    empty = decomposition.decompose(df.iloc[:0])
    assert empty.empty and set(decomposition.COLUMNS) <= set(empty.columns)


# --- a recommendation -------------------------------------------------------------------------
def test_a_recommendation_carries_the_split_and_says_it_in_one_line():
    df = decomposition.decompose(trials_frame(aligned_study()))
    row = df[(df["trial"] == 2) & (df["concurrency"] == 1)].iloc[0]
    split = decomposition.record(row)
    assert list(split.model_dump()) == ["label", *decomposition.COLUMNS]
    assert split.label == "ngram k=3 window 1-3"
    assert split.path_cost == pytest.approx(0.83)
    assert verdicts.split_line(split) == (
        "ngram k=3 window 1-3: 1.06x \u00b10.02 over plain = path 0.83x \u00b10.02 x "
        "speculation 1.28x \u00b10.04")
    once = split.model_copy(update={"path_cost_spread": None, "speculation_gain_spread": None,
                                    "total_speedup_spread": None})
    assert verdicts.split_line(once).endswith(
        "1.06x over plain = path 0.83x x speculation 1.28x")


# --- the policy's ladder ----------------------------------------------------------------------
def test_the_ladder_keeps_each_ratio_with_its_relative_noise():
    from tuner.records.policy import LevelStat

    stat = LevelStat(speedup=10.65 / 10.1, noise=0.02, throughput=10.65, baseline=10.1, n=2,
                     n_baseline=2)
    split = SpeedupSplit.of(m(10.65, 0.01), plain=m(10.1, 0.02), aligned=m(8.3, 0.03))
    out = decomposition.policy_stats(stat, split)
    # policy.json keys each level's split after its speedup and counts, as it always has.
    assert list(out.model_dump()) == ["speedup", "noise", "throughput", "baseline", "n",
                                      "n_baseline", "path_cost", "path_noise",
                                      "speculation_gain", "gain_noise"]
    assert "path_cost" not in stat.model_dump()
    assert out.path_cost == 8.3 / 10.1 and out.path_noise == 0.03
    assert decomposition.policy_stats(stat, None) is stat
    line = policy_words.split_sentence("ngram k=3", {8: stat, 1: out})
    assert line == ("ngram k=3 over the plain baseline, split into the engine path's cost "
                    "(aligned baseline over plain) and speculation's own gain: c=1 1.05x "
                    "\u00b10.02 = path 0.82x \u00b10.02 x speculation 1.28x \u00b10.04.")
    assert policy_words.split_sentence("ngram k=3", {1: stat}) is None

"""tuner.analysis.recommend: fronts, speedups and every refusal rule, on hand-checked numbers."""

from __future__ import annotations

import json
import math
import shlex

import pandas as pd
import pytest

# tests/ holds the shared fakes; it is not a package, so put it on the path explicitly.
from study_fakes import (
    ALIGNED,
    add_complete,
    add_failed,
    add_running,
    aligned_study,
    fake_level,
    fake_settings,
    fake_study,
    ngram,
    realistic_study,
    suffix,
)

from tuner.analysis import pareto
from tuner.analysis.frame import configs_frame, configs_of, trials_frame
from tuner.analysis.level_context import serve_config
from tuner.analysis.pareto import knee, pareto_front, speedups
from tuner.analysis.recommend import recommend, recommendations
from tuner.outputs import trial_reasons
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.recommendations import Basis, Noise, Recommendation, WindowSpread
from tuner.search.study import settings_of


def pareto_speedups(study):
    """The frame as tuner.api renders it: speedups over the plain baseline."""
    return speedups(trials_frame(study))


def study_recommendations(study):
    """Every level's recommendation as tuner.api renders them: the frame and the settings."""
    return recommendations(pareto_speedups(study), settings_of(study))


def _with(study, **fields):
    """The study's settings with `fields` changed (as a resumed command changes them)."""
    return settings_of(study).model_copy(update=fields)


def points(*rows: tuple) -> pd.DataFrame:
    """(trial, tpot_ms, throughput[, state]) -> a one-level frame as pareto_front sees it."""
    return pd.DataFrame([{"trial": r[0], "mean_tpot_ms": r[1], "output_throughput": r[2],
                          "state": r[3] if len(r) > 3 else "COMPLETE", "concurrency": 1}
                         for r in rows])


def front_trials(df: pd.DataFrame) -> list[int]:
    return list(pareto_front(df)["trial"])


# --- Pareto fronts --------------------------------------------------------------------------


def test_front_excludes_dominated_points_and_sorts_by_latency():
    df = points((0, 40, 20), (1, 20, 45), (2, 25, 40), (3, 16, 57), (4, 30, 50))
    # 3 beats 1 and 2 on both axes; 4 is slower but has more throughput than 1 and 2 only.
    assert front_trials(df) == [3]
    df = points((0, 40, 20), (1, 20, 45), (2, 15, 30), (3, 30, 60))
    assert front_trials(df) == [2, 1, 3]


def test_identical_points_are_both_on_the_front():
    df = points((0, 20, 50), (1, 20, 50), (2, 30, 40))
    assert front_trials(df) == [0, 1]


def test_equal_on_one_axis_better_on_the_other_dominates():
    df = points((0, 20, 50), (1, 20, 49), (2, 19, 50))
    assert front_trials(df) == [2]


def test_failed_and_unmeasured_rows_are_ignored():
    df = points((0, 40, 20), (1, 10, 99, "FAIL"), (2, 30, 30), (3, math.nan, math.nan,
                                                                  "RUNNING"))
    assert front_trials(df) == [2]


def test_single_trial_and_empty_frames():
    assert front_trials(points((5, 20, 50))) == [5]
    assert front_trials(points((5, 20, 50, "FAIL"))) == []


def test_front_refuses_mixed_levels():
    df = pd.concat([points((0, 20, 50)), points((1, 30, 60)).assign(concurrency=8)])
    with pytest.raises(ValueError, match="one concurrency level"):
        pareto_front(df)


def test_knee_of_a_bent_front():
    # Normalised, the chord runs from (0,0) to (1,1); (0.2, 0.8) is farthest from it.
    front = points((0, 10, 10), (1, 12, 18), (2, 20, 20))
    assert front.loc[knee(pareto_front(front)), "trial"] == 1
    two = points((0, 10, 10), (1, 20, 20))
    assert two.loc[knee(two), "trial"] == 1  # no bend: the most throughput


# --- the frame ------------------------------------------------------------------------------


def test_frame_rows_per_level_and_failed_running_rows():
    df = trials_frame(realistic_study())
    assert len(df[df["trial"] == 0]) == 2  # baseline measured at c=1 and c=8
    fail = df[df["state"] == "FAIL"]
    assert len(fail) == 1 and pd.isna(fail["concurrency"].iloc[0])
    assert "<script>" in fail["reason"].iloc[0] and fail["failure_kind"].iloc[0] == \
        "engine_crashed"
    running = df[df["state"] == "RUNNING"]
    assert len(running) == 1 and pd.isna(running["reason"].iloc[0])  # outputs words the state
    worded = trial_reasons.with_reasons(df)
    assert "not finished" in worded.loc[worded["state"] == "RUNNING", "reason"].iloc[0]
    assert worded.loc[worded["state"] == "FAIL", "reason"].iloc[0] == fail["reason"].iloc[0]
    assert running["label"].iloc[0] == "ngram k=6 window 3-6"
    assert "params_ngram.num_speculative_tokens" in df.columns


def test_spread_is_median_and_mad_over_original_and_repeats():
    df = trials_frame(realistic_study())
    ng = df[(df["trial"] == 1) & (df["concurrency"] == 1)].iloc[0]
    # 47.7, 46.9, 48.4 -> median 47.7, deviations 0, 0.8, 0.7 -> MAD 0.7
    assert ng["n_measurements"] == 3 and ng["n_repeats"] == 2
    assert ng["output_throughput_median"] == pytest.approx(47.7)
    assert ng["output_throughput_mad"] == pytest.approx(0.7)
    single = df[(df["trial"] == 2) & (df["concurrency"] == 1)].iloc[0]
    assert single["n_repeats"] == 0 and math.isnan(single["output_throughput_mad"])
    # A copied result is not a new measurement: the duplicate shares trial 1's spread.
    dup = df[(df["trial"] == 8) & (df["concurrency"] == 1)].iloc[0]
    assert dup["n_measurements"] == 3 and dup["duplicate_of"] == 1


def test_the_frame_carries_each_config_as_a_record_and_k_once():
    import copy

    study = fake_study()
    add_complete(study, None, [fake_level(1, output_throughput=20.0, mean_tpot_ms=50.0)],
                 role="baseline")
    add_complete(study, suffix(8), [fake_level(1, output_throughput=40.0, mean_tpot_ms=25.0)])
    depth_only = {"method": "suffix", "suffix_decoding_max_tree_depth": 12}
    add_complete(study, depth_only, [fake_level(1, output_throughput=30.0, mean_tpot_ms=30.0)])
    df = trials_frame(study)
    configs = configs_of(df)
    assert set(configs) == set(df["config_key"])
    for _, row in df.iterrows():
        config = configs[row["config_key"]]
        assert isinstance(config, TrialConfig) and config.label() == row["label"]
        # K as vLLM resolves it: the config's own, else the method's default (the tree depth)
        assert (None if pd.isna(row["num_speculative_tokens"])
                else row["num_speculative_tokens"]) == config.k
    assert list(df["num_speculative_tokens"].fillna(0)) == [0, 8, 12]
    # Stored in key order, as spec_json writes it, whatever order the search used.
    assert all(list(c.speculative_config or {}) == sorted(c.speculative_config or {})
               for c in configs.values())
    # Frames derived from it keep the same records; a copy shares them (they are frozen).
    assert configs_of(df[df["trial"] > 0]) is configs
    assert configs_of(configs_frame(df)) is configs and copy.deepcopy(configs) is configs
    with pytest.raises(ValueError, match="trials_frame"):
        configs_of(pd.DataFrame({"config_key": []}))


def test_points_are_the_measured_rows_with_medians_and_their_fronts():
    study = realistic_study()
    df = speedups(trials_frame(study))
    drawn = pareto.points(df)
    measured = drawn.measured
    assert (measured["state"] == "COMPLETE").all() and measured["duplicate_of"].isna().all()
    assert 8 not in set(measured["trial"])  # a copy answered from storage sits on trial 1
    one = measured[(measured["trial"] == 1) & (measured["concurrency"] == 1)].iloc[0]
    assert one["output_throughput"] == pytest.approx(47.7)  # the median of its 3 runs
    assert sorted(drawn.fronts) == [1, 8]
    for c, front in drawn.fronts.items():
        assert front.equals(pareto_front(measured[measured["concurrency"] == c]))
    with pytest.raises(ValueError, match="speedups"):
        pareto.points(trials_frame(study))


# --- speedups -------------------------------------------------------------------------------


def study_with(*configs, concurrencies=(1,), **meta):
    """configs: (spec or None, {c: (throughput, tpot)}, role)."""
    study = fake_study(concurrencies=concurrencies, **meta)
    for spec, by_level, *role in configs:
        levels = [fake_level(c, output_throughput=t, mean_tpot_ms=p)
                  for c, (t, p) in by_level.items()]
        add_complete(study, spec, levels, role=role[0] if role else
                     ("baseline" if spec is None else "search"))
    return study


def test_speedup_against_the_baseline_at_the_same_concurrency():
    study = study_with((None, {1: (20.0, 50.0), 8: (100.0, 80.0)}),
                       (ngram(5), {1: (40.0, 25.0), 8: (110.0, 72.7)}), concurrencies=(1, 8))
    df = speedups(trials_frame(study))
    row = df[(df["trial"] == 1) & (df["concurrency"] == 1)].iloc[0]
    assert row["speedup_throughput"] == pytest.approx(2.0)
    assert row["speedup_tpot"] == pytest.approx(2.0)
    row8 = df[(df["trial"] == 1) & (df["concurrency"] == 8)].iloc[0]
    assert row8["speedup_throughput"] == pytest.approx(1.1)
    assert row8["speedup_tpot"] == pytest.approx(80.0 / 72.7)


def test_speedup_never_mixes_studies_and_needs_a_baseline():
    a = trials_frame(study_with((None, {1: (20.0, 50.0)}), (ngram(5), {1: (40.0, 25.0)})))
    b = trials_frame(study_with((ngram(5), {1: (30.0, 30.0)})))  # no baseline here
    b["study"] = "other"
    both = speedups(pd.concat([a, b], ignore_index=True))
    assert both.loc[both["study"] == "other", "speedup_throughput"].isna().all()
    assert both.loc[(both["study"] != "other") & (both["trial"] == 1),
                    "speedup_throughput"].iloc[0] == pytest.approx(2.0)


# --- recommendation and refusals ------------------------------------------------------------


def test_recommends_the_knee_with_commands():
    study = study_with((None, {1: (20.0, 50.0)}), (ngram(5), {1: (40.0, 25.0)}),
                       (suffix(8), {1: (50.0, 20.0)}), (ngram(2), {1: (30.0, 33.0)}))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert isinstance(rec, Recommendation)
    assert rec.status == "recommend" and rec.trial == 2
    assert rec.speculative_config == suffix(8)
    assert rec.speedup_throughput == pytest.approx(2.5)
    assert rec.serve_command.startswith("vllm serve /models/SmolLM2-135M-Instruct "
                                        "--speculative-config '")
    assert json.loads(shlex.split(rec.serve_command)[4]) == suffix(8)
    # Single runs (no spread measured), but +150% is far beyond run-to-run noise.
    v = rec.verdict
    assert v.basis == Basis.BEYOND_NOISE and v.chosen_by == "knee"
    assert v.noise == Noise.UNMEASURED and v.measurements == (1, 1) and v.interval is None
    with pytest.raises(ValueError):  # frozen
        rec.status = "speculation_off"


def test_verify_command_parses_with_the_cli():
    from tuner.cli import build_parser

    study = study_with((None, {1: (20.0, 50.0)}), (ngram(5), {1: (40.0, 25.0)}),
                       (suffix(8), {1: (50.0, 20.0)}))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    argv = shlex.split(rec.verify_command)
    assert argv[:2] == ["tuner", "bench"]
    args = build_parser().parse_args(argv[1:])
    # As the CLI reads the same values typed by hand.
    want = build_parser().parse_args([
        "bench", "--speculative-config", json.dumps(suffix(8)), "--concurrency", "1",
        "--engine-args=--enforce-eager", "--model", "/models/SmolLM2-135M-Instruct",
        "--workload", "instructcoder"])
    for name in ("speculative_config", "concurrency", "engine_args", "model", "workload"):
        assert getattr(args, name) == getattr(want, name), name


def test_refuses_without_a_baseline():
    study = study_with((ngram(5), {1: (40.0, 25.0)}), (suffix(8), {1: (50.0, 20.0)}))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "insufficient_data" and rec.speculative_config is None
    assert rec.verdict.basis == Basis.NO_BASELINE and rec.verdict.baseline_failure is None
    assert "--speculative-config none" in rec.verify_command


def test_refuses_when_the_baseline_failed_and_says_why():
    study = study_with((ngram(5), {1: (40.0, 25.0)}), (suffix(8), {1: (50.0, 20.0)}))
    add_failed(study, None, role="baseline", reason="out of memory", kind="engine_crashed")
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "insufficient_data" and rec.verdict.basis == Basis.NO_BASELINE
    assert "out of memory" in rec.verdict.baseline_failure


def test_refuses_with_too_few_speculative_configs():
    study = study_with((None, {1: (20.0, 50.0)}), (ngram(5), {1: (40.0, 25.0)}))
    add_complete(study, ngram(5), [fake_level(1, output_throughput=40.0, mean_tpot_ms=25.0)],
                 duplicate_of=1)  # the same config again does not count twice
    add_running(study, suffix(8))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "insufficient_data" and rec.verdict.basis == Basis.TOO_FEW_CONFIGS
    assert rec.verdict.configs_completed == 1
    assert rec.speculative_config is None
    # A refusal has no spread; recommendation.json keeps writing it as an empty mapping.
    assert rec.spread is None and rec.model_dump(mode="json")["spread"] == {}


def test_refuses_a_gain_within_the_measured_spread():
    study = fake_study()
    lv = lambda t: [fake_level(1, output_throughput=t, mean_tpot_ms=1000 / t)]  # noqa: E731
    add_complete(study, None, lv(100.0), role="baseline", repeats=[lv(90.0), lv(110.0)])
    add_complete(study, ngram(5), lv(104.0))
    add_complete(study, ngram(3), lv(101.0))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    # Gain +4% against a baseline MAD of 10/100 = 10%: noise, so speculation stays off.
    assert rec.status == "speculation_off" and rec.speculative_config is None
    v = rec.verdict
    assert v.basis == Basis.WITHIN_NOISE
    assert v.subject == "ngram k=5 window 2-5" and v.speedup == pytest.approx(1.04)  # the best
    assert v.noise == Noise.MEASURED and v.noise_spread == pytest.approx(0.10)
    assert rec.spread.relative_throughput_spread == pytest.approx(0.10)
    assert rec.spread.noise_floor == pytest.approx(0.10)
    assert "--speculative-config" not in rec.serve_command
    # Re-measure that config beside the baseline.
    base_line, best_line = rec.verify_command.split(" && ")
    assert "--speculative-config none" in base_line and "ngram" in best_line


def _twice(study, spec, c, first, second, *, role="search"):
    """One config measured twice at level `c` (a trial and its repeat)."""
    lv = lambda t: [fake_level(c, output_throughput=t, mean_tpot_ms=3.0)]  # noqa: E731
    add_complete(study, spec, lv(first), role=role, repeats=[lv(second)])


def test_a_gain_beside_a_zero_spread_is_no_finding():
    # The fake engine's study (tuner optimize ... speculative_path_differs, 9 trials): every
    # config measured twice with identical throughputs, so the MAD is 0 and the +0.03% gain
    # is not "larger than the spread"; the 2% floor still makes it no finding.
    study = fake_study()
    _twice(study, None, 1, 327.6, 327.6, role="baseline")
    _twice(study, ngram(8, 3, 3), 1, 327.7, 327.7)
    _twice(study, ngram(5), 1, 327.5, 327.5)
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "speculation_off" and rec.speculative_config is None
    v = rec.verdict
    assert v.basis == Basis.WITHIN_NOISE and v.subject == "ngram k=8 window 3-3"
    assert (v.subject_throughput, v.baseline_throughput) == (327.7, 327.6)
    assert v.noise == Noise.FLOOR and v.noise_spread == 0.0
    assert rec.spread.relative_throughput_spread == 0.0
    assert rec.spread.noise_floor == pytest.approx(0.02)
    assert rec.label == "baseline (no speculation)" and rec.speedup_throughput == 1.0
    # Identical launches: the speedup interval has no width and lies within the 2% margin.
    iv = v.interval
    assert iv.launches == (2, 2) and iv.confidence == 0.95 and iv.lo == pytest.approx(iv.hi)
    assert iv.decision == "equivalent" and iv.margin == 0.02
    assert rec.speedup_interval == pytest.approx((327.7 / 327.6, 327.7 / 327.6))
    assert "ngram" in rec.verify_command


def test_a_single_run_counts_with_the_spread_its_repeated_peers_showed():
    # The H200 study (benchmarks/data/h200/ngram-study-32p, c=1): baseline 536.9/509.5, ngram
    # k=8 window 1-6 594.4/467.6, k=8 window 1-5 534.5/521.7, and the calibration k=8 window 1-2
    # once at 562.5 (+7.5%).
    study = fake_study()
    _twice(study, None, 1, 536.9, 509.5, role="baseline")  # MAD 13.7 of 523.2: 2.6%
    _twice(study, ngram(8, 1, 6), 1, 594.4, 467.6)  # MAD 63.4 of 531.0: 11.9%
    _twice(study, ngram(8, 1, 5), 1, 534.5, 521.7)
    lv = [fake_level(1, output_throughput=562.5, mean_tpot_ms=3.0)]
    add_complete(study, ngram(8, 1, 2), lv, role="calibration")
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    v = rec.verdict
    assert rec.status == "speculation_off" and v.basis == Basis.WITHIN_NOISE
    assert v.subject == "ngram k=8 window 1-2" and v.speedup == pytest.approx(1.075, abs=0.005)
    assert v.noise == Noise.SINGLE_RUN and v.noise_spread == pytest.approx(0.119, abs=5e-4)
    assert rec.spread.single_run_spread == pytest.approx(63.4 / 531.0)
    # Peers that repeat within 1%: the single run is held to the 5% floor, and +7.5% passes
    # it; but its interval over the launches holds 1.00x, so it is no finding: words follow
    # the interval, never "turn on" on one that holds 1.00x.
    study = fake_study()
    _twice(study, None, 1, 536.9, 509.5, role="baseline")
    _twice(study, ngram(8, 1, 6), 1, 530.0, 532.0)
    _twice(study, ngram(8, 1, 5), 1, 534.5, 521.7)
    add_complete(study, ngram(8, 1, 2), lv, role="calibration")
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.speculative_config is None and rec.verdict.basis == Basis.INTERVAL_OPEN
    assert rec.verdict.interval.lo <= 1.0 <= rec.verdict.interval.hi
    assert rec.spread.single_run_spread == pytest.approx(0.05)


def test_a_single_launch_whose_windows_did_not_settle_counts_no_surer_than_they_moved():
    # The H100 study (benchmarks/data/h100/ngram-study-32p-c1c8, c=1): baseline 518.8/573.9,
    # the leader ngram k=6 window 1-6 once at 648.8 (+18.8%), its windows unsettled at ±22.7%.
    study = fake_study()
    _twice(study, None, 1, 518.8, 573.9, role="baseline")
    lv = fake_level(1, output_throughput=648.8, mean_tpot_ms=1.4)
    unsettled = {**lv, "stability_pct": 22.7, "converged": False, "windows": [600.0, 700.0]}
    add_complete(study, ngram(6, 1, 6), [unsettled])
    twin = [fake_level(1, output_throughput=436.4, mean_tpot_ms=2.1)]  # k=6 window 1-5, once
    add_complete(study, ngram(6, 1, 5), twin)
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    v = rec.verdict
    assert rec.status == "speculation_off" and v.basis == Basis.WITHIN_NOISE
    assert v.noise == Noise.UNSETTLED_WINDOWS and v.noise_spread == pytest.approx(0.227)
    assert rec.spread.unsettled_spread == pytest.approx(0.227)
    assert rec.spread.single_run_spread == pytest.approx(0.227)
    # The same launch with windows that settled: the 5% taken for one run, and +18.8% counts.
    study = fake_study()
    _twice(study, None, 1, 518.8, 573.9, role="baseline")
    settled = {**unsettled, "stability_pct": 1.5, "converged": True}
    add_complete(study, ngram(6, 1, 6), [settled])
    add_complete(study, ngram(6, 1, 5), twin)
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.label == "ngram k=6 window 1-6" and rec.spread.unsettled_spread is None


def test_a_one_percent_gain_against_a_smaller_spread_is_no_finding():
    # 1.01x (+0.9%) against a ±0.6% MAD: larger than the MAD, not larger than the 2% floor.
    study = fake_study(concurrencies=(8,))
    _twice(study, None, 8, 2562.4, 2593.4, role="baseline")  # median 2577.9, MAD 15.5 (0.6%)
    _twice(study, ngram(8, 3, 3), 8, 2590.0, 2611.2)  # median 2600.6
    _twice(study, ngram(5), 8, 2570.0, 2580.0)
    rec = recommend(trials_frame(study), concurrency=8, settings=settings_of(study))
    v = rec.verdict
    assert rec.status == "speculation_off" and v.basis == Basis.WITHIN_NOISE
    assert (v.subject_throughput, v.baseline_throughput) == (2600.6, 2577.9)
    assert rec.spread.relative_throughput_spread == pytest.approx(15.5 / 2577.9)
    # Two launches each: the interval is open, so the noise floor decided as before.
    iv = v.interval
    assert iv.decision == "open" and iv.launches == (2, 2)
    assert (round(iv.lo, 2), round(iv.point, 2), round(iv.hi, 2)) == (0.99, 1.01, 1.03)


def test_a_gain_beyond_the_spread_and_the_floor_is_recommended():
    study = fake_study()
    _twice(study, None, 1, 100.0, 101.0, role="baseline")  # MAD 0.5%
    _twice(study, ngram(5), 1, 103.0, 104.0)  # +3%: beyond both
    _twice(study, ngram(3), 1, 100.5, 101.0)  # +0.0%: noise
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "recommend" and rec.speculative_config == ngram(5)
    v = rec.verdict
    assert v.basis == Basis.BEYOND_NOISE and v.subject == "ngram k=5 window 2-5"
    assert v.interval.decision == "above" and v.interval.launches == (2, 2)
    assert (round(v.interval.lo, 2), round(v.interval.point, 2), round(v.interval.hi, 2)) == \
        (1.01, 1.03, 1.05)
    assert rec.launches == (2, 2) and rec.confidence_level == 0.95


def test_the_knee_is_taken_among_measurable_gains_only():
    # Over every point that gains, the knee is ngram k=3 (+1.5%, below the 2% floor); a knee
    # that is noise must not hide suffix's +30%: only measurable gains are candidates.
    study = fake_study()
    lv = lambda t, p: [fake_level(1, output_throughput=t, mean_tpot_ms=p)]  # noqa: E731
    add_complete(study, None, lv(100.0, 10.0), role="baseline", repeats=[lv(100.0, 10.0)])
    add_complete(study, ngram(2), lv(100.5, 7.0), repeats=[lv(100.5, 7.0)])
    add_complete(study, ngram(3), lv(101.5, 7.1), repeats=[lv(101.5, 7.1)])
    add_complete(study, suffix(8), lv(130.0, 12.0), repeats=[lv(130.0, 12.0)])
    df = speedups(trials_frame(study))
    gaining = pareto_front(df[df["trial"] > 0])
    assert df.loc[knee(gaining), "trial"] == 2  # the old rule's choice
    rec = recommend(df, concurrency=1)
    assert rec.status == "recommend" and rec.speculative_config == suffix(8)


def test_nothing_beats_the_baseline_means_speculation_off():
    study = study_with((None, {8: (111.0, 66.0)}), (ngram(5), {8: (96.0, 76.0)}),
                       (ngram(2), {8: (105.0, 70.0)}), concurrencies=(8,))
    rec = recommend(trials_frame(study), concurrency=8, settings=settings_of(study))
    assert rec.status == "speculation_off" and rec.speculative_config is None
    v = rec.verdict
    assert v.basis == Basis.NOTHING_BEATS_BASELINE and v.subject == "ngram k=2 window 2-5"
    assert round(v.speedup, 2) == 0.95
    assert "--speculative-config" not in rec.serve_command
    assert rec.serve_command.startswith("vllm serve /models/SmolLM2-135M-Instruct")
    # Verified by re-measuring the best speculative config beside the baseline, not the
    # baseline alone.
    base_line, best_line = rec.verify_command.split(" && ")
    assert "--speculative-config none" in base_line
    assert json.loads(shlex.split(best_line)[shlex.split(best_line).index(
        "--speculative-config") + 1]) == ngram(2)


def test_slos_pick_the_fastest_feasible_config():
    study = study_with((None, {1: (20.0, 50.0)}), (suffix(8), {1: (50.0, 20.0)}),
                       (ngram(5), {1: (40.0, 18.0)}))
    # suffix has more throughput but misses the TPOT SLO.
    rec = recommend(trials_frame(study), concurrency=1, max_tpot_ms=19.0,
                    settings=settings_of(study))
    assert rec.status == "recommend" and rec.speculative_config == ngram(5)
    assert rec.verdict.chosen_by == "slos" and not rec.verdict.baseline_meets_slos
    assert rec.slos == {"max_tpot_ms": 19.0, "max_ttft_ms": None}


def test_slos_nobody_meets_and_only_the_baseline_meets():
    study = study_with((None, {1: (20.0, 50.0)}), (suffix(8), {1: (50.0, 20.0)}),
                       (ngram(5), {1: (40.0, 18.0)}))
    df = trials_frame(study)
    none = recommend(df, concurrency=1, max_tpot_ms=10.0)
    assert none.status == "insufficient_data"
    assert none.verdict.basis == Basis.NO_CONFIG_MEETS_SLOS and none.verdict.subject_tpot_ms == 18.0
    # Every fake level has a 108 ms p99 TTFT; with the spec configs' made 150 ms, only the
    # baseline meets a 120 ms TTFT SLO (p99, as the study constrains it).
    df.loc[df["method"] != "none", "p99_ttft_ms"] = 150.0
    off = recommend(df, concurrency=1, max_ttft_ms=120.0)
    assert off.status == "speculation_off" and off.verdict.slos_set
    assert off.verdict.basis == Basis.NOTHING_BEATS_BASELINE


def test_recommendations_cover_every_level_with_stored_slos():
    study = realistic_study()
    recs = recommendations(trials_frame(study), settings_of(study))
    assert [r.concurrency for r in recs] == [1, 8]
    assert all(r.status == "recommend" for r in recs)
    assert recs[0].trial == 2 and recs[0].n_repeats == 0
    constrained = realistic_study(name="slo", max_tpot_ms=17.0)
    assert recommendations(trials_frame(constrained), settings_of(constrained)
                           )[0].slos["max_tpot_ms"] == 17.0


def test_a_study_with_only_a_baseline_is_not_a_crash():
    study = study_with((None, {1: (20.0, 50.0)}))
    (rec,) = recommendations(trials_frame(study), settings_of(study))
    assert rec.status == "insufficient_data" and rec.verdict.configs_completed == 0
    empty = fake_study(name="empty")
    assert recommendations(trials_frame(empty), settings_of(empty))[0].status == \
        "insufficient_data"


def test_a_baseline_still_running_is_named_as_the_reason():
    study = study_with((ngram(5), {1: (40.0, 25.0)}), (suffix(8), {1: (50.0, 20.0)}))
    add_running(study, None, role="baseline")
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "insufficient_data" and rec.verdict.baseline_waiting


def test_repeat_trials_of_one_config_are_pooled_and_the_original_is_chosen():
    study = fake_study()
    lv = lambda t: [fake_level(1, output_throughput=t, mean_tpot_ms=1000 / t)]  # noqa: E731
    add_complete(study, None, lv(20.0), role="baseline")
    add_complete(study, ngram(5), lv(40.0))
    add_complete(study, suffix(8), lv(50.0))
    add_complete(study, suffix(8), lv(46.0), role="repeat")
    add_complete(study, suffix(8), lv(52.0), role="repeat")
    df = trials_frame(study)
    assert list(df.loc[df["trial"] >= 2, "output_throughput_mad"]) == [2.0, 2.0, 2.0]
    rec = recommend(df, concurrency=1)
    assert rec.trial == 2 and rec.n_repeats == 2
    assert rec.spread.output_throughput_mad == pytest.approx(2.0)
    # The baseline ran once: its interval borrows the 2 degrees of freedom suffix's pooled.
    iv = rec.verdict.interval
    assert iv.launches == (3, 1) and iv.decision == "above"
    assert (iv.pool_df, iv.pool_configs) == (2, 1) and rec.launches == (3, 1)


# --- speedup intervals across launches (tuner.intervals) -------------------------------------


def _thrice(study, spec, first, second, third, *, role="search"):
    """One config launched three times at c=1 (a trial and two repeats)."""
    lv = lambda t: [fake_level(1, output_throughput=t, mean_tpot_ms=1000 / t)]  # noqa: E731
    add_complete(study, spec, lv(first), role=role, repeats=[lv(second), lv(third)])


def test_a_settled_interval_counts_a_gain_the_noise_floor_would_not():
    # ngram k=5 ran once at +4%: alone it is held to the 5% a single run can differ by, but
    # the baseline's and k=8's launches pool a 0.8% spread, whose interval lies above 1.00x.
    study = fake_study()
    _thrice(study, None, 100.0, 101.0, 99.0, role="baseline")
    _thrice(study, ngram(8, 3, 3), 100.5, 101.3, 99.7)
    add_complete(study, ngram(5), [fake_level(1, output_throughput=104.0, mean_tpot_ms=9.6)])
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "recommend" and rec.speculative_config == ngram(5)
    assert rec.spread.noise_floor == pytest.approx(0.05)  # what the floor asked for
    lo, hi = rec.speedup_interval
    assert 1.0 < lo < 1.04 < hi and rec.launches == (1, 3)
    v = rec.verdict
    assert v.basis == Basis.INTERVAL_ABOVE and v.noise_floor == pytest.approx(0.05)
    assert v.interval.decision == "above" and v.interval.launches == (1, 3)
    assert round(v.interval.point, 2) == 1.04


def test_leave_it_off_says_the_best_configs_interval_within_the_margin():
    study = fake_study()
    _thrice(study, None, 100.0, 100.4, 99.6, role="baseline")
    _thrice(study, ngram(8, 3, 3), 100.5, 100.9, 100.1)
    _thrice(study, ngram(5), 95.0, 95.4, 94.6)
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    v = rec.verdict
    assert rec.status == "speculation_off" and v.basis == Basis.WITHIN_NOISE
    lo, hi = rec.speedup_interval
    assert 0.98 < lo < 1.0 < hi < 1.02
    # The interval's point is the ratio of the launches' geometric means (1.005 here).
    assert v.interval.point == pytest.approx(1.005, abs=1e-3)
    assert v.interval.decision == "equivalent" and v.interval.launches == (3, 3)
    assert rec.equivalence_margin == 0.02


def test_within_a_wider_margin_the_interval_overrules_the_noise_floor():
    # +3% passes the 2% floor; with --margin 5 the interval (about 1.02-1.04) says it is no
    # difference that matters, and the reason says the interval decided.
    study = fake_study()
    _thrice(study, None, 100.0, 100.4, 99.6, role="baseline")
    _thrice(study, ngram(8, 3, 3), 103.0, 103.4, 102.6)
    _thrice(study, ngram(5), 95.0, 95.4, 94.6)
    df = trials_frame(study)
    assert recommend(df, concurrency=1).status == "recommend"  # the default 2% margin
    rec = recommend(df, concurrency=1, settings=_with(study, margin=0.05))
    assert rec.status == "speculation_off" and rec.speculative_config is None
    v = rec.verdict
    assert v.basis == Basis.INTERVAL_EQUIVALENT and v.speedup == pytest.approx(1.03)
    assert v.noise_floor == pytest.approx(0.02) and v.interval.margin == 0.05
    assert rec.equivalence_margin == 0.05
    # A higher --confidence widens the interval past the band: at 99.9% it is no longer
    # within 5% of 1.00x, but still above it, and it is recommended again.
    wide = recommend(df, concurrency=1, settings=_with(study, margin=0.05, confidence=0.999))
    iv = wide.verdict.interval
    assert wide.status == "recommend" and iv.decision == "above" and iv.confidence == 0.999
    assert (round(iv.lo, 2), round(iv.point, 2), round(iv.hi, 2)) == (1.01, 1.03, 1.05)


def test_speculation_off_states_the_fastest_configs_interval():
    study = fake_study()
    _thrice(study, None, 100.0, 101.0, 99.0, role="baseline")
    _thrice(study, ngram(8, 3, 3), 90.0, 91.0, 89.0)
    _thrice(study, ngram(5), 80.0, 81.0, 79.0)
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.status == "speculation_off"
    v = rec.verdict
    assert v.basis == Basis.NOTHING_BEATS_BASELINE and v.subject == "ngram k=8 window 3-3"
    assert v.interval.decision == "below" and v.interval.launches == (3, 3)
    assert round(v.interval.point, 2) == 0.90 and v.interval.hi < 0.95


def test_without_repeats_there_is_no_interval_and_the_old_words_stay():
    study = study_with((None, {1: (20.0, 50.0)}), (ngram(5), {1: (40.0, 25.0)}),
                       (suffix(8), {1: (50.0, 20.0)}))
    rec = recommend(trials_frame(study), concurrency=1, settings=settings_of(study))
    assert rec.speedup_interval is None and rec.launches is None
    assert rec.verdict.interval is None and rec.verdict.noise == Noise.UNMEASURED


# --- engine path and speculation (an aligned baseline) ---------------------------------------


def test_the_recommendation_says_what_the_path_costs_in_one_line():
    recs = {r.concurrency: r for r in study_recommendations(aligned_study())}
    on = recs[1]
    assert on.status == "recommend" and on.label == "ngram k=3 window 1-3"
    assert on.speedup_throughput == pytest.approx(0.83 * 1.28)  # still against the plain one
    split = on.decomposition
    assert split.path_cost == pytest.approx(0.83) and split.speculation_gain == \
        pytest.approx(1.28) and split.path_cost_spread == pytest.approx(0.03 * 0.83)
    # Where speculation loses, the split says whether the path or speculation lost.
    off = recs[32]
    assert off.status == "speculation_off"
    assert off.decomposition.label == "ngram k=5 window 2-5"
    assert off.decomposition.path_cost == pytest.approx(0.92)
    assert off.decomposition.speculation_gain == pytest.approx(0.89)
    assert recs[8].decomposition.path_cost == pytest.approx(1.06)
    assert recs[8].decomposition.speculation_gain == pytest.approx(0.92)


def test_a_path_ratio_within_its_spread_of_one_is_no_cost_or_gain():
    # The aligned baseline is 0.99x of the plain one with a 2% spread: the path's cost is not
    # measurable, so no "costs 1%" is stated; the spreads still are.
    study = fake_study()
    lv = lambda t: [fake_level(1, output_throughput=t, mean_tpot_ms=1000 / t)]  # noqa: E731
    add_complete(study, None, lv(100.0), role="baseline", repeats=[lv(99.0), lv(101.0)])
    add_complete(study, None, lv(99.0), role="aligned_baseline", config=ALIGNED,
                 repeats=[lv(97.0), lv(101.0)])
    add_complete(study, ngram(5), lv(130.0))
    add_complete(study, ngram(3), lv(120.0))
    rec = recommend(pareto_speedups(study), concurrency=1)
    assert rec.decomposition.path_cost == pytest.approx(0.99)
    assert rec.decomposition.path_cost_spread == pytest.approx(0.02, abs=1e-3)


def test_without_an_aligned_baseline_the_recommendation_has_no_split():
    for rec in study_recommendations(realistic_study()):
        assert rec.decomposition is None


def test_serve_command_names_the_model_as_the_user_gave_it():
    (rec, *_) = study_recommendations(aligned_study())
    assert rec.serve_command.startswith("vllm serve HuggingFaceTB/SmolLM2-135M-Instruct ")
    assert "/root/.cache" not in rec.serve_command
    # The verify lines name no model: `tuner bench` loads the embedded default without one.
    for each in study_recommendations(aligned_study()):
        assert "/root/.cache" not in each.verify_command and "--model" not in each.verify_command
    assert shlex.split(rec.serve_command)[-3:] == ["--max-model-len", "4096", "--enforce-eager"]
    assert rec.serve_config == {
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "speculative-config": {"method": "ngram", "num_speculative_tokens": 3,
                               "prompt_lookup_min": 1, "prompt_lookup_max": 3},
        "max-model-len": 4096, "enforce-eager": True}


def test_serve_config_maps_every_flag_form_as_vllm_reads_it():
    settings = fake_settings().model_copy(update={"engine_spec": EngineSpec(
        model="/models/llama", extra_args=(
            "-tp", "2", "--no-async-scheduling", "--gpu-memory-utilization=0.85",
            "--compilation-config", '{"level": 0}', "--max-model-len", "4k", "--seed", "-1",
            "--enable-prefix-caching"))})
    config = TrialConfig(speculative_config=ngram(5), engine_args={"max_num_seqs": 64,
                                                                  "enforce_eager": False})
    assert serve_config(settings, config) == {
        "model": "/models/llama", "speculative-config": ngram(5), "max-num-seqs": 64,
        "tensor-parallel-size": 2, "async-scheduling": False, "gpu-memory-utilization": 0.85,
        "compilation-config": {"level": 0}, "max-model-len": "4k", "seed": -1,
        "enable-prefix-caching": True}


def test_a_single_launch_carries_how_far_its_own_windows_spread():
    from tuner.analysis.noise import window_spreads

    def row(label, pct, converged, thr):
        return pd.Series({"label": label, "stability_pct": pct, "converged": converged,
                          "speedup_throughput": thr})

    assert window_spreads(row("k4", 2.9, True, 1.42), row("base", 17.0, False, 1.0)) == (
        WindowSpread(label="k4", pct=2.9, settled=True),
        WindowSpread(label="the baseline", pct=17.0, settled=False))
    assert window_spreads(row("k4", None, None, 1.4), row("base", None, None, 1.0)) == ()


def test_a_config_launched_once_counts_no_surer_than_its_paired_windows_moved():
    from tuner.analysis.noise import _paired_window_spread

    base = pd.Series({"prompts_digest": "d", "windows": (10.0, 20.0, 30.0)})
    win = pd.Series({"prompts_digest": "d", "windows": (20.0, 44.0, 54.0)})  # 2.0, 2.2, 1.8x
    assert _paired_window_spread(win, base) == pytest.approx(0.2 / 2.0)
    # Other requests, a study stored before digests, or one window: nothing paired.
    assert _paired_window_spread(win.copy().set_axis(win.index), base.replace("d", "e")) is None
    assert _paired_window_spread(pd.Series({"prompts_digest": None, "windows": (1.0, 2.0)}),
                                 pd.Series({"prompts_digest": None, "windows": (1.0, 2.0)})) \
        is None
    assert _paired_window_spread(pd.Series({"prompts_digest": "d", "windows": (1.0,)}),
                                 pd.Series({"prompts_digest": "d", "windows": (1.0,)})) is None

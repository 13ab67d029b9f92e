"""The out-of-sample check (tuner/analysis/verification.py; its words in
tuner/outputs/verification.py): which config each level is checked on, and whether the
speedup measured on fresh prompts falls inside the interval the study stated."""

from __future__ import annotations

import json

import pytest
from study_fakes import add_complete, fake_level, fake_study, ngram, realistic_study

from tuner.analysis import frame, pareto, recommend
from tuner.analysis import verification as v
from tuner.outputs import verification as words
from tuner.records.configs import RequestSchedule, TrialConfig
from tuner.records.trials import Failure
from tuner.records.verification import (
    CheckOutcome,
    SkipReason,
    Verification,
    VerifyLaunch,
    VerifyTarget,
)
from tuner.search.study import settings_of

PICK = TrialConfig(speculative_config=ngram(5))
TARGET = VerifyTarget(concurrency=1, status="recommend", subject=PICK,
                      subject_label=PICK.label(), stated_speedup=2.0,
                      stated_interval=(1.8, 2.2), confidence=0.95)


def _targets(study):
    df = pareto.speedups(frame.trials_frame(study))
    return v.targets(df, recommend.recommendations(df, settings_of(study)))


def _launch(n: int, role: str, tput: float | None, *, config: TrialConfig = PICK,
            c: int = 1) -> VerifyLaunch:
    config = TrialConfig() if role == "baseline" else config
    failed = Failure(reason="vLLM exited", kind="engine_died") if tput is None else None
    return VerifyLaunch(number=n, round=n // 2 + 1, role=role, config=config,
                        label=config.label(), throughputs={} if tput is None else {c: tput},
                        failure=failed)


@pytest.mark.parametrize(("measured", "outcome"), [
    (2.0, CheckOutcome.INSIDE), (1.8, CheckOutcome.INSIDE), (2.2, CheckOutcome.INSIDE),
    (1.79, CheckOutcome.BELOW), (2.21, CheckOutcome.ABOVE)])
def test_inside_means_within_the_stated_bounds_included(measured, outcome):
    assert v.decide(measured, (1.8, 2.2)) == outcome


def test_the_measured_speedup_is_the_ratio_of_the_medians_and_a_miss_is_a_miss():
    launches = [_launch(0, "baseline", 20.0), _launch(1, "subject", 30.0),
                _launch(2, "baseline", 21.0), _launch(3, "subject", 31.0),
                _launch(4, "baseline", 40.0), _launch(5, "subject", 32.0)]
    check = v.check(TARGET, launches, requests=4)
    assert check.subject_throughputs == (30.0, 31.0, 32.0)
    assert check.baseline_throughputs == (20.0, 21.0, 40.0)
    assert check.measured_speedup == pytest.approx(31.0 / 21.0)
    assert check.outcome == CheckOutcome.BELOW and check.missed
    assert check.subject_spread == pytest.approx(1.0 / 31.0)  # MAD over median
    assert check.requests == 4
    inside = v.check(TARGET, [_launch(0, "baseline", 20.0), _launch(1, "subject", 40.0)])
    assert inside.outcome == CheckOutcome.INSIDE and not inside.missed
    assert inside.subject_spread is None  # one launch: no spread


def test_a_failed_launch_is_left_out_and_a_side_with_none_left_is_unmeasured():
    launches = [_launch(0, "baseline", 20.0), _launch(1, "subject", None),
                _launch(2, "baseline", 20.0), _launch(3, "subject", 40.0)]
    check = v.check(TARGET, launches)
    assert check.subject_throughputs == (40.0,) and check.outcome == CheckOutcome.INSIDE
    none = v.check(TARGET, [_launch(0, "baseline", 20.0), _launch(1, "subject", None)])
    assert none.outcome == CheckOutcome.UNMEASURED and none.measured_speedup is None
    # Another config's launches are not this level's subject's.
    other = TrialConfig(speculative_config=ngram(3))
    assert v.check(TARGET, [_launch(0, "baseline", 20.0),
                            _launch(1, "subject", 40.0, config=other)]
                   ).outcome == CheckOutcome.UNMEASURED


def test_each_level_is_checked_on_the_recommended_config_with_the_stated_interval():
    study = realistic_study()
    targets = _targets(study)
    df = frame.trials_frame(study)
    recs = recommend.recommendations(pareto.speedups(df), settings_of(study))
    for t, rec in zip(targets, recs, strict=True):
        assert t.skip is None and t.status == "recommend"
        assert t.subject.speculative_config == rec.speculative_config
        assert t.stated_interval == rec.speedup_interval
        assert t.stated_speedup == rec.verdict.interval.point
        assert t.confidence == rec.confidence_level
    assert v.subjects(targets) == (targets[0].subject,)  # one config picked at both levels


def test_where_speculation_stays_off_the_fastest_config_the_verdict_names_is_checked():
    study = fake_study(concurrencies=(1,))
    base = [fake_level(1, output_throughput=30.0, mean_tpot_ms=30.0)]
    add_complete(study, None, base, role="baseline",
                 repeats=[[fake_level(1, output_throughput=30.5, mean_tpot_ms=30.0)]])
    for k, tput in ((5, 24.0), (3, 26.0)):
        add_complete(study, ngram(k), [fake_level(1, output_throughput=tput, mean_tpot_ms=36.0,
                                                  acceptance_length=1.5, k=k)],
                     repeats=[[fake_level(1, output_throughput=tput + 0.3, mean_tpot_ms=36.0,
                                          acceptance_length=1.5, k=k)]])
    (t,) = _targets(study)
    assert t.status == "speculation_off" and t.skip is None
    assert t.subject == TrialConfig(speculative_config=ngram(3))  # the faster of the two
    assert t.stated_interval is not None and t.stated_interval[1] < 1.0


def test_a_level_without_an_interval_is_skipped_and_nothing_else_launches():
    study = fake_study(concurrencies=(1,))
    add_complete(study, None, [fake_level(1, output_throughput=30.0, mean_tpot_ms=30.0)],
                 role="baseline")
    (t,) = _targets(study)  # too few configs: no interval
    assert t.skip == SkipReason.NO_INTERVAL and t.subject is None
    assert v.subjects((t,)) == ()
    assert v.check(t, []).outcome == CheckOutcome.SKIPPED


def test_the_record_is_worded_by_outputs_a_miss_out_loud(tmp_path):
    launches = [_launch(0, "baseline", 20.0), _launch(1, "subject", 30.0)]
    miss = v.check(TARGET, launches)
    inside = v.check(TARGET.model_copy(update={"stated_interval": (1.4, 1.6)}), launches)
    skipped = v.check(VerifyTarget(concurrency=4, status="insufficient_data",
                                   skip=SkipReason.NO_INTERVAL), launches)
    record = Verification(study="s", study_dir=str(tmp_path), workload="instructcoder",
                          launches_per_config=1, pool_prompts=40, excluded_prompts=17,
                          schedule=RequestSchedule(workload_digest="d", levels=()),
                          levels=(miss, inside, skipped), launches=tuple(launches))
    assert record.misses == (miss,)
    text = words.table(record)
    assert "MISS" in words.sentence(miss) and "MISS" not in words.sentence(inside)
    assert "skipped" in words.sentence(skipped)
    assert all(words.sentence(c) in text for c in record.levels)
    doc = json.loads(words.write(record, tmp_path).read_text())
    assert doc.pop("said") == [words.sentence(c) for c in record.levels]
    assert Verification.model_validate(doc) == record  # verify.json is the record, read back


def test_a_level_decided_on_the_workload_sample_is_checked_against_the_forecast():
    from tuner.records.selection import Choice, Selection
    from tuner.search import study as st

    study = fake_study()
    add_complete(study, None, [fake_level(1, output_throughput=40.0, mean_tpot_ms=20.0)],
                 role="baseline")
    add_complete(study, ngram(5), [fake_level(1, output_throughput=80.0, mean_tpot_ms=10.0)],
                 role="calibration")
    unlaunched = TrialConfig(speculative_config=ngram(7))
    sel = Selection(concurrency=1, choice=Choice.UNDECIDED, subject=unlaunched.label(),
                    subject_key=unlaunched.key(), subject_config=unlaunched, speedup=1.9,
                    lo=0.95, hi=3.1, confidence=0.95, indifference=0.02)
    st.store_selections(study, [sel])
    df = pareto.speedups(frame.trials_frame(study))
    recs = recommend.recommendations(df, settings_of(study), st.selections_of(study))
    assert recs[0].status == "insufficient_data" and recs[0].verdict.selection == sel
    assert recs[0].speedup_interval == (0.95, 3.1) and recs[0].serve_command is None
    (target,) = v.targets(df, recs)
    assert target.subject == unlaunched and target.stated_interval == (0.95, 3.1)
    assert target.stated_speedup == 1.9 and target.skip is None


def test_a_forecast_for_the_workload_is_checked_against_what_a_few_fresh_prompts_may_show():
    # The stated interval is about the workload's mean over a sample of 120 prompts (their
    # spread ±3% on the mean, ±33% per prompt); 16 fresh prompts stray from that mean by
    # ±8.2% on their own, and the check's launches add their noise: the range the check
    # judges by holds both, and the stated interval's own verdict is kept beside it.
    import math

    from tuner import intervals

    target = TARGET.model_copy(update={"stated_speedup": 2.0, "stated_interval": (1.8, 2.22),
                                       "sample_sd": 0.03, "sample_prompts": 120,
                                       "cost_sd": 0.04, "cost_df": 10})
    launches = [_launch(0, "baseline", 20.0), _launch(1, "subject", 48.0),
                _launch(2, "baseline", 20.4), _launch(3, "subject", 48.5)]
    check = v.check(target, launches, requests=16)
    assert check.measured_speedup == pytest.approx(48.25 / 20.2)  # 2.39x: above 1.8-2.22
    assert check.stated_outcome == CheckOutcome.ABOVE
    assert check.fresh_sd == pytest.approx(0.03 * math.sqrt(120 / 16))
    pool = intervals.Pool.of([(48.0, 48.5), (20.0, 20.4)])
    assert check.launch_sd == pytest.approx(pool.sd)  # sqrt(1/2 + 1/2) = 1
    half = intervals.t_quantile(0.975, 10) * math.sqrt(
        0.03 ** 2 + 0.04 ** 2 + check.fresh_sd ** 2 + check.launch_sd ** 2)
    assert check.expected_interval == pytest.approx((2.0 * math.exp(-half),
                                                     2.0 * math.exp(half)))
    assert check.outcome == CheckOutcome.INSIDE  # 2.39 < 2.0 e^0.23 = 2.52
    said = words.sentence(check)
    assert "inside the range expected of 16 fresh prompts" in said
    assert "the measurement lies above it" in said and "MISS" not in said
    far = v.check(target, [_launch(0, "baseline", 20.0), _launch(1, "subject", 60.0)],
                  requests=16)
    assert far.outcome == CheckOutcome.ABOVE and "MISS" in words.sentence(far)
    # Without the sample's figures (an interval resting on launches) the stated one judges.
    plain = v.check(TARGET, launches, requests=16)
    assert plain.expected_interval is None and plain.outcome == CheckOutcome.ABOVE

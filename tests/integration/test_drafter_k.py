"""The K axis of a model-based drafter from one launch, on the fake engine simulating a drafter
(tuner.testing.fake_engine's drafter_rates: a geometric agreement, drawn per correction;
the drafter's cost per step and per drafted position): one launch at K_max predicts acceptance
at every smaller K within the accuracy its counts give, and a second launch at K=1 prices
the other K's throughput within THROUGHPUT_TOLERANCE_PCT of launches at them, the step cost
it fits matching the fake's known one."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
from conftest import fake_engine_spec

from tuner.measure import trial as runner
from tuner.outputs import drafter_k as drafter_words
from tuner.records.configs import MeasureSettings, Prompt, TrialConfig, Workload, WorkloadSpec
from tuner.replay import drafter_k
from tuner.replay.drafter_launches import drafter_axes
from tuner.replay.measured import MeasuredTrial

RATES = tuple(round(0.8 ** (i + 1), 4) for i in range(5))  # geometric: 0.8 given the last
SCRIPT = dict(ttft_ms=20.0, tpot_ms=10.0, load_per_seq=0.3, verify_cost_per_token=0.02,
              drafter_rates=RATES, drafter_ms_per_token=0.8, drafter_ms_per_step=1.5,
              drafter_seed=3)
LEVELS = (1, 4)
SETTINGS = MeasureSettings(concurrencies=LEVELS, num_requests=24, warmup_output_len=4)
OUTPUT = 48
# The fake writes each token at its deadline within a ms or two of timer slop (tokens of
# 4-10 ms here; at 1-2 ms a token on the loaded host one launch measured 20% slow),
# and the load model's in-flight count changes as a level drains: 5% is what out-of-sample
# throughput may miss by on it (issue 49's goal on the CPU engine too).
THROUGHPUT_TOLERANCE_PCT = 5.0
# A launch the fake served more than this far from its script is measured again (up to
# FIDELITY_TRIES launches): the level drains at its end, so c=4 runs a little under its step.
FIDELITY_PCT = 6.0
FIDELITY_TRIES = 3


def _workload() -> Workload:
    prompts = tuple(Prompt(prompt=" ".join(f"p{i}w{j}" for j in range(6 + i % 5)),
                           prompt_len=6 + i % 5, output_len=OUTPUT) for i in range(80))
    return Workload(spec=WorkloadSpec(name="random", num_prompts=80), prompts=prompts)


def _draft(k: int) -> TrialConfig:
    return TrialConfig(speculative_config={"method": "draft_model", "model": "/fake/draft",
                                           "num_speculative_tokens": k})


@pytest.fixture(scope="module")
def launches(tmp_path_factory: pytest.TempPathFactory) -> dict[int, MeasuredTrial]:
    """K -> its launch (0: the baseline)."""
    root: Path = tmp_path_factory.mktemp("drafter")
    spec = fake_engine_spec(**SCRIPT)
    out = {}
    for number, k in enumerate((0, 5, 1, 2, 3)):
        cfg = _draft(k) if k else TrialConfig()
        for attempt in range(FIDELITY_TRIES):
            got = runner.measure_outcome(spec, cfg, _workload(), SETTINGS,
                                         str(root / f"{k}-{attempt}"))
            assert got.failure is None, got.failure
            levels = {lv.concurrency: lv for lv in got.result.levels}
            if all(_served_as_scripted(k, lv) for lv in levels.values()):
                break
        else:
            pytest.fail(f"the fake engine fell behind its script at K={k} in "
                        f"{FIDELITY_TRIES} launches (host load {os.getloadavg()})")
        out[k] = MeasuredTrial(number=number, config=cfg, role="baseline" if not k else "search",
                               levels=levels)
    return out


def _step_ms(k: int, c: int) -> float:
    """The fake's scripted step at K and c in-flight requests (tuner.testing.fake_engine)."""
    step = SCRIPT["tpot_ms"] * (1 + SCRIPT["load_per_seq"] * (c - 1))
    if k:
        step *= 1 + SCRIPT["verify_cost_per_token"] * k * c
        step += SCRIPT["drafter_ms_per_step"] + SCRIPT["drafter_ms_per_token"] * k
    return step


def _served_as_scripted(k: int, lv) -> bool:
    """Whether the fake kept to its script in this level: decode time per token within
    FIDELITY_PCT of its scripted step over 1 + the expected accepted count. On a loaded
    shared host a starved fake writes late (a launch measured 35% slow): that launch is a
    fault of the host, not of the prediction under test, and is measured again."""
    scripted = _step_ms(k, lv.concurrency) / (1 + sum(RATES[:k]))
    decoded = lv.total_output_tokens - lv.completed
    measured = (lv.mean_e2el_ms - lv.mean_ttft_ms) * lv.completed / decoded
    return abs(measured / scripted - 1) * 100 <= FIDELITY_PCT


def _axis(launches: dict[int, MeasuredTrial], ks: tuple[int, ...]):
    [ax] = drafter_axes([launches[k] for k in ks], {}, LEVELS, max_num_seqs=256)
    return ax


def test_one_launch_at_k_max_predicts_acceptance_at_every_smaller_k(launches) -> None:
    ax = _axis(launches, (0, 5, 1, 2, 3))
    assert ax.source_k == 5 and ax.launched_k == (1, 2, 3, 5)
    for p in ax.points:
        if p.source or not p.measured_trials:
            continue
        # The tolerance the counts give: three SEs of the difference of two launches' means.
        tol = 3 * math.hypot(p.acceptance_length_se, p.meas_acceptance_length_se)
        assert abs(p.acceptance_length - p.meas_acceptance_length) <= tol, p
        assert not p.acceptance_miss
        # ... and the fake's truth, 1 + the first K rates, lies within it too.
        assert abs(p.acceptance_length - (1 + sum(RATES[:p.k]))) <= 3 * p.acceptance_length_se


def test_a_launch_at_k1_calibrates_the_drafter_and_prices_every_other_k(launches) -> None:
    ax = _axis(launches, (0, 5, 1, 2, 3))
    assert ax.calibrated
    for cost in ax.costs:
        c = cost.concurrency
        # The fake's step at level c: tpot (1 + load (c - 1)) (1 + verify K c) + the drafter's
        # 1.5 ms + 0.8 ms K: per token tpot (1 + load (c-1)) verify c + 0.8, fixed 1.5. The
        # measured steps carry the drawn counts' noise (the step is decode time x measured
        # length): within 15% on the slope, 1.5 ms on the fixed part.
        per = _step_ms(1, c) - _step_ms(0, c) - SCRIPT["drafter_ms_per_step"]
        assert cost.per_token_ms == pytest.approx(per, rel=0.15), cost
        assert cost.fixed_ms == pytest.approx(SCRIPT["drafter_ms_per_step"], abs=1.5), cost
    for p in ax.points:
        if p.fitted or not p.measured_trials:
            continue
        assert abs(p.err_output_throughput_pct) <= THROUGHPUT_TOLERANCE_PCT, p
        assert not p.throughput_miss


def test_with_one_launch_the_cost_is_not_calibrated_and_the_record_says_so(launches) -> None:
    ax = _axis(launches, (0, 5))
    assert not ax.calibrated and all(c.fitted_on_k == (5,) for c in ax.costs)
    assert all(c.fixed_ms == 0 for c in ax.costs)
    assert [p.k for p in ax.points if p.concurrency == 1] == [1, 2, 3, 4, 5]
    # The fixed 1.5 ms the fit leaves out is spread over K=5's slope: K=1 is predicted faster
    # than the fake serves it.
    k1 = next(p for p in ax.points if p.concurrency == 1 and p.k == 1)
    measured = launches[1].levels[1].output_throughput
    assert k1.output_throughput > measured


def test_the_stated_accuracy_is_the_floor_or_the_counts(launches) -> None:
    ax = _axis(launches, (0, 5, 2))
    p = next(p for p in ax.points if p.k == 2 and p.concurrency == 1)
    spread = math.hypot(p.acceptance_length_se, p.meas_acceptance_length_se)
    assert p.acceptance_accuracy_pct == pytest.approx(max(
        drafter_k.ACCEPTANCE_FLOOR_PCT, 300 * spread / p.acceptance_length))




SPACE = """
name: draft-fake
description: a draft model on the fake engine
methods:
  draft_model:
    model: {draft}
    num_speculative_tokens: {{type: choice, values: [5, 2]}}
engine: {{}}
start_points:
  - {{method: draft_model, num_speculative_tokens: 5}}
"""


def test_a_draft_study_writes_every_k_to_predicted_csv_and_tuner_predict_lists_them(
        tmp_path: Path) -> None:
    from tuner import api
    from tuner.measure.workloads import EMBEDDED_TOKENIZER
    from tuner.outputs import predictions
    from tuner.records.configs import WorkloadSpec
    from tuner.records.options import OptimizeOptions

    space = tmp_path / "draft.yaml"
    (tmp_path / "draft").mkdir()  # the fake loads no model; the space's check wants a folder
    space.write_text(SPACE.format(draft=tmp_path / "draft"))
    said: list[str] = []
    api.optimize(OptimizeOptions(
        strategy="optuna", workload=WorkloadSpec(name="instructcoder", num_prompts=6,
                                                 output_len=24),
        space_name=str(space), settings=MeasureSettings(concurrencies=(1, 2)),
        out_dir=tmp_path / "study", study_name="s", n_trials=3,
        objectives=["output_throughput"], target_concurrency=1, constraints={}),
        engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=2,
                                drafter_rates=RATES, load_per_seq=0.1,
                                drafter_ms_per_token=0.3),
        say=said.append)
    rows = predictions.read_rows(predictions.load_predictions(tmp_path / "study"))
    drafted = sorted((r.concurrency, int(r.drafted_per_step)) for r in rows
                     if r.method == "draft_model")
    assert drafted == [(c, k) for c in (1, 2) for k in range(1, 6)]
    # Every draft row is priced, and the launched K carry their measured figures.
    assert all(r.pred_output_throughput for r in rows if r.method == "draft_model")
    measured = {int(r.drafted_per_step) for r in rows if r.measured_trials}
    assert 5 in measured
    assert any("every K 1-5" in line for line in said)
    pred = api.predict(study_dir=tmp_path / "study", space_name=str(space), say=said.append)
    [ax] = pred.drafters
    assert ax.source_k == 5 and [p.k for p in ax.points if p.concurrency == 2] == [1, 2, 3, 4, 5]
    text = drafter_words.axes_text(pred.drafters)
    assert "c=1" in text and "c=2" in text

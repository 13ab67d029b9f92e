"""Step-cost model and predictions: synthetic engines whose step cost is a known line."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tuner.outputs import decision_words
from tuner.outputs.decision_words import step_cost_text
from tuner.records.configs import TrialConfig
from tuner.records.predictions import PredictedRow
from tuner.records.results import LevelMetrics
from tuner.replay import acceptance, cost, schedule
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.search import candidates, replay_confirm
from tuner.search import space as spaces
from tuner.tokens import RequestTokens, TokenCapture

pytestmark = pytest.mark.vllm  # steps vLLM's proposers: fails where vLLM is missing


def replay_spec(capture, spec, **kwargs):
    """acceptance.replay of the --speculative-config `spec`."""
    return acceptance.replay(capture, TrialConfig(speculative_config=spec), **kwargs)


def test_a_line_through_two_points_is_exact():
    line = cost.fit(4, [cost.Point("base", 4, 20.0, 100.0, anchor=True),
                        cost.Point("k8", 20, 36.0, 140.0)], path=cost.PATH_PLAIN)
    assert line.calibrated
    assert line.step_ms(4) == pytest.approx(20.0)
    assert line.step_ms(12) == pytest.approx(28.0)


def test_the_line_passes_through_the_anchor_and_fits_the_rest():
    pts = [cost.Point("base", 1, 10.0, 50.0, anchor=True), cost.Point("k4", 3, 13.0, 50.0),
           cost.Point("k8", 5, 20.0, 50.0)]
    line = cost.fit(1, pts, path=cost.PATH_PLAIN)
    assert line.step_ms(1) == pytest.approx(10.0)  # exact at the baseline, whatever the rest
    # slope: least squares through (1, 10) over (2, 3) and (4, 10) -> (6 + 40) / (4 + 16)
    assert line.b == pytest.approx(46 / 20)


def test_the_anchor_alone_is_flat_and_not_calibrated():
    line = cost.fit(1, [cost.Point("base", 1, 10.0, 50.0, anchor=True)], path=cost.PATH_PLAIN)
    assert not line.calibrated
    assert line.step_ms(9) == pytest.approx(10.0)
    assert cost.fit(1, [], path=cost.PATH_PLAIN) is None


def _capture(seed: int = 0) -> TokenCapture:
    """Outputs that copy spans of their prompts, so n-gram drafts get accepted often."""
    rng = np.random.default_rng(seed)
    reqs = []
    for c in (1, 2):
        for warm, n in ((True, c), (False, 6)):
            for i in range(n):
                prompt = rng.integers(0, 50, 200).astype(np.int32)
                parts = [prompt[s:s + 12] for s in rng.integers(0, 180, 6)]
                output = np.concatenate(parts + [rng.integers(50, 90, 10).astype(np.int32)])
                reqs.append(RequestTokens(c, i, warm, prompt, output, max_tokens=len(output)))
    return TokenCapture(tuple(reqs))


A_MS, B_MS, TTFT_MS = {1: 8.0, 2: 9.0}, {1: 0.5, 2: 0.4}, 40.0
PREFILL = cost.Prefill(ms_per_token=0.05, overhead_ms=25.0)


def _level(c: int, tpot: float, thr: float, acc_len: float | None = None,
           ttft: float = TTFT_MS, played: schedule.Schedule | None = None) -> LevelMetrics:
    """A measured level; `played` (a synthetic engine's play) gives the request counts and
    the mean latency that its decode time per token implies."""
    nan = math.nan
    completed, out_tokens, e2e = 6, 0, nan
    if played is not None:
        completed, out_tokens = len(played.ttft_ms), played.output_tokens
        e2e = ttft + played.decode_ms_per_token * (out_tokens - completed) / completed
    return LevelMetrics(
        concurrency=c, num_requests=completed, completed=completed, failed=0,
        warmup_requests=c, duration=1.0, total_input_tokens=0, total_output_tokens=out_tokens,
        request_throughput=0.0, output_throughput=thr, total_token_throughput=thr,
        mean_ttft_ms=ttft, median_ttft_ms=ttft, p90_ttft_ms=nan, p99_ttft_ms=nan,
        mean_tpot_ms=tpot, median_tpot_ms=tpot, p90_tpot_ms=nan, p99_tpot_ms=nan,
        std_tpot_ms=0.0, mean_itl_ms=nan, median_itl_ms=nan, p90_itl_ms=nan, p99_itl_ms=nan,
        mean_e2el_ms=e2e, median_e2el_ms=e2e, p99_e2el_ms=nan,
        spec_decode_acceptance_length=acc_len)


def _synthetic_trial(number: int, cap: TokenCapture, spec: dict | None, role: str, *,
                     path_ms: float = 0.0, config: TrialConfig | None = None,
                     mixed_ms: float = 0.0, cudagraph_mode: str | None = None) -> MeasuredTrial:
    """What a synthetic engine measures whose step costs A + B x tokens scored (+ path_ms on
    a slower engine path, + mixed_ms where a step is not uniform) and whose prefills cost
    PREFILL: its levels played out step by step (tuner.replay.schedule, a fake engine)."""
    levels = {}
    for c in (1, 2):
        reqs = sorted(cap.level(c, warmup=False), key=lambda r: r.index)
        lengths, prompts = [len(r.output) for r in reqs], [len(r.prompt) for r in reqs]
        if spec is None:
            drafts, k, acc_len = schedule.baseline_drafts(lengths), 0, None
        else:
            acc = replay_spec(cap, spec, levels=[c])[c]
            drafts, k, acc_len = acc.request_drafts, acc.k, acc.acceptance_length

        def step(n: float, u: float, c: int = c) -> float:
            return A_MS[c] + path_ms + B_MS[c] * n + mixed_ms * u

        played = schedule.simulate(drafts, lengths, concurrency=c, k=k, step_ms=step,
                                   prompts=prompts, prefill_ms_per_token=PREFILL.ms_per_token,
                                   overhead_ms=PREFILL.overhead_ms)
        levels[c] = _level(c, played.mean_tpot_ms, thr=played.output_throughput,
                           acc_len=acc_len, ttft=played.mean_ttft_ms, played=played)
    return MeasuredTrial(number, config or TrialConfig(speculative_config=spec), role, levels,
                         cap, cudagraph_mode=cudagraph_mode)


NG = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1,
      "prompt_lookup_max": 4}
SMALL = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}


def test_predictions_recover_a_known_step_cost_out_of_sample():
    cap = _capture()
    measured = [_synthetic_trial(0, cap, None, "baseline"),
                _synthetic_trial(1, cap, NG, "calibration"),
                _synthetic_trial(2, cap, SMALL, "confirm")]
    pred = predict(cap, [TrialConfig(speculative_config=NG), TrialConfig(speculative_config=SMALL)],
                   measured, max_model_len=4096, max_num_seqs=16)
    for c in (1, 2):
        assert pred.costs[c].b == pytest.approx(B_MS[c], rel=1e-3)
        assert pred.costs[c].a == pytest.approx(A_MS[c], rel=1e-3)
        assert pred.costs[c].prefill.ms_per_token == pytest.approx(PREFILL.ms_per_token, rel=0.05)
        assert pred.costs[c].prefill.overhead_ms == pytest.approx(PREFILL.overhead_ms, rel=0.05)
    small = [r for r in pred.rows if r.label == TrialConfig(speculative_config=SMALL).label()]
    for r in small:  # not a calibration point, yet predicted exactly: the model is the engine
        assert not r.calibration
        assert r.err_mean_tpot_pct == pytest.approx(0.0, abs=0.5)
        assert r.err_output_throughput_pct == pytest.approx(0.0, abs=0.5)
        assert r.pred_mean_ttft_ms == pytest.approx(r.meas_mean_ttft_ms, rel=0.02)
        assert r.err_acceptance_length_pct == pytest.approx(0.0, abs=1e-9)
        assert r.pred_speedup > 1.0  # copied spans: speculation pays on this engine
    best = pred.leaders(1, 1)[0]
    assert best.method == "ngram"


def test_each_error_has_the_measured_spread_between_launches_beside_it():
    cap = _capture()
    base = _synthetic_trial(0, cap, None, "baseline")
    # The baseline launched again, 4% faster at every level: its own half-range is 2% of
    # the median; the other configs ran once, so the level's pooled SD is the baseline's.
    again = dataclasses.replace(base, number=3, levels={
        c: lv.model_copy(update={"output_throughput": lv.output_throughput * 1.04})
        for c, lv in base.levels.items()})
    measured = [base, _synthetic_trial(1, cap, NG, "calibration"),
                _synthetic_trial(2, cap, SMALL, "confirm"), again]
    pred = predict(cap, [TrialConfig(speculative_config=NG), TrialConfig(speculative_config=SMALL)],
                   measured, max_model_len=4096, max_num_seqs=16)
    sd = 100 * abs(math.log(1.04)) / math.sqrt(2)  # two launches: |log ratio| / sqrt(2)
    for r in pred.rows:
        assert r.level_output_throughput_sd_pct == pytest.approx(sd)
        if r.method == "none":
            assert r.meas_output_throughput_spread_pct == pytest.approx(100 * 0.04 / 2.04)
        else:  # launched once: no spread of its own
            assert r.meas_output_throughput_spread_pct is None


def test_the_fit_reads_decode_time_per_token_not_mean_tpot():
    # One request of two tokens whose only gap held another's prefill can triple a level's
    # mean TPOT (sharegpt, c=4: 57 then 145 ms for one baseline) while its decode time per
    # token, sum(e2e - TTFT) / sum(N - 1), hardly moves: the fit must not see the outlier.
    cap = _capture()
    base = _synthetic_trial(0, cap, None, "baseline")
    skewed = {c: lv.model_copy(update={"mean_tpot_ms": 3.0 * lv.mean_tpot_ms})
              for c, lv in base.levels.items()}
    measured = [dataclasses.replace(base, levels=skewed), _synthetic_trial(1, cap, NG,
                                                                           "calibration")]
    pred = predict(cap, [TrialConfig(speculative_config=NG)], measured, max_model_len=4096,
                   max_num_seqs=16)
    for c in (1, 2):
        assert pred.costs[c].a == pytest.approx(A_MS[c], rel=1e-3)
        assert pred.costs[c].b == pytest.approx(B_MS[c], rel=1e-3)


def test_a_table_extended_with_more_configs_equals_one_predicted_at_once():
    # The search's climb adds configs to a table without predicting it again: every row
    # depends on its own config and the measured trials only.
    cap = _capture()
    measured = [_synthetic_trial(0, cap, None, "baseline"),
                _synthetic_trial(1, cap, NG, "calibration")]
    first, more = [TrialConfig(speculative_config=NG)], [TrialConfig(speculative_config=SMALL)]
    kw = dict(max_model_len=4096, max_num_seqs=16)
    whole = predict(cap, first + more, measured, **kw)
    parts = predict(cap, first, measured, **kw).extended(predict(cap, more, measured, **kw))
    assert parts.configs == whole.configs == 2

    def table(pred):
        return sorted((r.key, r.concurrency, r.pred_output_throughput,
                       r.pred_mean_tpot_ms) for r in pred.rows)

    assert table(parts) == table(whole)


def test_a_plane_through_three_points_is_exact_and_two_points_ask_for_a_third():
    base = cost.Point("base", 1, 2.4, 10.0, anchor=True)
    heavy = cost.Point("k8", 7.6, 2.4 + 0.15 * 6.6 + 6.0 * 0.3, 10.0, mixed=0.3)
    rare = cost.Point("k6 w6", 1.3, 2.4 + 0.15 * 0.3 + 6.0 * 0.95, 10.0, mixed=0.95)
    line = cost.fit(1, [base, heavy], path=cost.PATH_ALIGNED, mixed_term=True)
    assert line.needs_mixed_point and not line.mixed_fitted and line.m == 0.0
    plane = cost.fit(1, [base, heavy, rare], path=cost.PATH_ALIGNED, mixed_term=True)
    assert plane.mixed_fitted and not plane.needs_mixed_point
    assert (plane.a + plane.b, plane.b, plane.m) == pytest.approx((2.4, 0.15, 6.0))
    assert "non-uniform share" in step_cost_text(plane.fit_record())
    # Without split CUDA graphs the same points get the line, and ask for nothing more.
    flat = cost.fit(1, [base, heavy, rare], path=cost.PATH_ALIGNED)
    assert not flat.mixed_term and not flat.needs_mixed_point and flat.m == 0.0
    # Points that all share one u cannot tell m from the intercept: still the line.
    same_u = cost.Point("k7", 3.0, 5.0, 10.0, mixed=0.3)
    shifted = cost.Point("b", 1, 2.4, 10.0, anchor=True, mixed=0.3)
    assert cost.fit(1, [shifted, heavy, same_u], path=cost.PATH_ALIGNED,
                    mixed_term=True).needs_mixed_point


def test_split_cuda_graphs_price_non_uniform_steps_out_of_sample():
    """An engine whose non-uniform steps cost 6 ms more (the H200's n-gram path): a line in
    tokens scored alone ranks the rare drafter wrong; the plane, fitted on the heavy and the
    rare drafter, predicts a third config exactly."""
    cap = _capture()
    graphs = "FULL_AND_PIECEWISE"
    rare = {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 4,
            "prompt_lookup_max": 4}
    base = _synthetic_trial(0, cap, None, "baseline")
    cal = [_synthetic_trial(1, cap, NG, "calibration", mixed_ms=6.0, cudagraph_mode=graphs)]
    pred = predict(cap, [TrialConfig(speculative_config=SMALL)], [base, *cal],
                   max_model_len=4096, max_num_seqs=16)
    assert all(c.needs_mixed_point for c in pred.costs.values())
    cal.append(_synthetic_trial(2, cap, rare, "calibration", mixed_ms=6.0, cudagraph_mode=graphs))
    third = _synthetic_trial(3, cap, SMALL, "confirm", mixed_ms=6.0, cudagraph_mode=graphs)
    pred = predict(cap, [TrialConfig(speculative_config=SMALL)], [base, *cal, third],
                   max_model_len=4096, max_num_seqs=16)
    for c in (1, 2):
        assert pred.costs[c].mixed_fitted
        assert pred.costs[c].m == pytest.approx(6.0, rel=1e-3)
        assert pred.costs[c].b == pytest.approx(B_MS[c], rel=1e-3)
    small = [r for r in pred.rows if r.label == TrialConfig(speculative_config=SMALL).label()]
    assert small and all(not r.calibration for r in small)
    assert all(0.0 < r.uniform_share < 1.0 for r in small)
    for r in small:
        assert r.err_mean_tpot_pct == pytest.approx(0.0, abs=0.5)
        assert r.err_output_throughput_pct == pytest.approx(0.0, abs=0.5)


def test_without_a_speculative_trial_only_acceptance_is_predicted():
    cap = _capture()
    pred = predict(cap, [TrialConfig(speculative_config=NG)],
                   [_synthetic_trial(0, cap, None, "baseline")], max_model_len=4096,
                   max_num_seqs=16)
    rows = [r for r in pred.rows if r.method == "ngram"]
    assert rows and all(r.pred_output_throughput is None for r in rows)
    assert all(r.acceptance_length > 1 for r in rows)
    assert not any(c.calibrated for c in pred.costs.values())
    assert pred.leaders(1, 3) == []


def test_candidates_cover_the_whole_ngram_grid_and_a_seeded_suffix_sample():
    sp = spaces.load("default")
    got = candidates.candidates(sp, seed=0)
    ngram = [c for c in got if c.method == "ngram"]
    suffix = [c for c in got if c.method == "suffix"]
    assert len(ngram) == len(sp.model_copy(update={"methods": {"ngram": sp.methods["ngram"]}})
                             .grid())
    assert candidates.SUFFIX_POINTS <= len(suffix) <= candidates.SUFFIX_POINTS + 1  # + start point
    assert [c.key() for c in got] == [c.key() for c in candidates.candidates(sp, seed=0)]
    assert len({c.key() for c in got}) == len(got)


def test_spaces_that_replay_cannot_predict_say_why():
    assert candidates.why_not_replayable(spaces.load("ngram"), rates=None) is None
    draft = candidates.why_not_replayable(spaces.load("draft"), rates=None)
    assert draft.why == "methods" and "ngram" in draft.replayable and draft.methods
    assert "cannot be replayed" in decision_words.unreplayable_text(draft)
    synthetic = candidates.why_not_replayable(spaces.load("ngram"), rates=[0.5])
    assert synthetic.why == "acceptance_profile"
    assert "synthetic" in decision_words.unreplayable_text(synthetic)


def test_leaders_to_confirm_take_the_best_of_each_method_first():
    ranked = [PredictedRow(key=key, label=key, method=method, concurrency=1)
              for method, key in (("suffix", "s1"), ("suffix", "s2"), ("ngram", "n1"),
                                  ("ngram", "n2"))]
    assert [r.key for r in replay_confirm._diverse(ranked, 2)] == ["s1", "n1"]
    assert [r.key for r in replay_confirm._diverse(ranked, 3)] == ["s1", "s2", "n1"]
    assert [r.key for r in replay_confirm._diverse(ranked[:2], 2)] == ["s1", "s2"]


def test_an_aligned_baseline_splits_each_predicted_speedup_into_path_cost_and_gain():
    # Speculation runs another engine path, 3 ms slower per step; the aligned baseline (no
    # speculation on that path) anchors the line, and each row says what the path costs.
    cap = _capture()
    aligned_cfg = TrialConfig(engine_args={"no_async_scheduling": True})
    plain = _synthetic_trial(0, cap, None, "baseline")
    aligned = _synthetic_trial(1, cap, None, "aligned_baseline", path_ms=3.0, config=aligned_cfg)
    measured = [plain, aligned, _synthetic_trial(2, cap, NG, "calibration", path_ms=3.0),
                _synthetic_trial(3, cap, SMALL, "confirm", path_ms=3.0)]
    pred = predict(cap, [TrialConfig(speculative_config=NG), TrialConfig(speculative_config=SMALL)],
                   measured, max_model_len=4096, max_num_seqs=16)
    for c in (1, 2):
        assert pred.costs[c].path == cost.PATH_ALIGNED
        assert pred.costs[c].a == pytest.approx(A_MS[c] + 3.0, rel=1e-3)
    small = [r for r in pred.rows if r.label == TrialConfig(speculative_config=SMALL).label()]
    for r in small:
        c = r.concurrency
        path_cost = aligned.levels[c].output_throughput / plain.levels[c].output_throughput
        assert r.path_cost == pytest.approx(path_cost) and r.path_cost < 1.0
        assert r.path_cost * r.pred_speculation_gain == pytest.approx(r.pred_speedup)
        measured_gain = r.meas_output_throughput / aligned.levels[c].output_throughput
        assert r.pred_speculation_gain == pytest.approx(measured_gain, rel=0.05)
    base_rows = [r for r in pred.rows if r.method == "none"]
    assert base_rows and all(r.path_cost is None for r in base_rows)

    without = predict(cap, [TrialConfig(speculative_config=SMALL)], [plain, measured[2]],
                      max_model_len=4096, max_num_seqs=16)
    assert all(r.path_cost is None and r.pred_speculation_gain is None
               for r in without.rows)
    assert all(c.path == cost.PATH_PLAIN for c in without.costs.values())


def _shaped(level: float, bump: float = 3.0) -> list[tuple[int, float]]:
    """One launch's (n, step ms): a line 30 + n, `level` ms slower, n = 2 `bump` ms dearer."""
    return [(n, level + 30.0 + n + (bump if n == 2 else 0.0))
            for n in (1, 2, 3, 4, 6, 9) for _ in range(cost.PROFILE_MIN_STEPS)]


def test_the_step_shape_keeps_how_steps_differ_within_a_launch_not_its_level():
    def residuals(launches):
        return {n: r for n, r, _ in cost.profile(launches)}

    shape = residuals([_shaped(0.0)])
    # Another launch 4 ms slower throughout (a busier machine) has the same shape.
    assert residuals([_shaped(4.0)]) == pytest.approx(shape)
    assert residuals([_shaped(0.0), _shaped(4.0)]) == pytest.approx(shape)
    # The bump stands out; the launch's own line through the bump leans a little (1 ms here).
    assert shape[2] > 2.0 and max(abs(r) for n, r in shape.items() if n != 2) < 1.0
    # n-gram drafts 0 or K: two n per launch, nothing beyond its line; sparse n are left out.
    assert cost.profile([[(1, 30.0)] * 50 + [(9, 40.0)] * 50]) == ()
    sparse = _shaped(0.0) + [(5, 99.0)] * (cost.PROFILE_MIN_STEPS - 1)
    assert 5 not in {n for n, _, _ in cost.profile([sparse])}


def test_speculative_steps_cost_the_line_plus_the_shape_and_the_baseline_the_line():
    line = cost.StepCost(concurrency=1, a=30.0, b=1.0, points=(), path=cost.PATH_PLAIN,
                         profile=((1, -0.5, 40), (2, 2.5, 40), (4, -0.5, 40)))
    assert line.step_ms(2) == pytest.approx(32.0)  # the baseline's steps: the line alone
    assert line.speculative_step_ms(2) == pytest.approx(34.5)
    assert line.speculative_step_ms(3) == pytest.approx(33.0 + 1.0)  # between profiled n
    assert line.speculative_step_ms(9) == pytest.approx(39.0)  # past the profile: the line
    assert "n=2 2.5 ms [40]" in step_cost_text(line.fit_record())
    flat = dataclasses.replace(line, profile=())
    assert flat.speculative_step_ms(2) == flat.step_ms(2)

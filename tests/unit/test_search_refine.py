"""The replay strategy's climb over sampled grids: neighbours on a space's grid, and `refine`
against a fake predictor whose predicted throughput is a known function of the knobs."""

from __future__ import annotations

import json
import types

from tuner.records.configs import TrialConfig
from tuner.records.predictions import PredictedRow
from tuner.replay.predict import Prediction
from tuner.search import candidates, k_curves
from tuner.search import space as spaces

SUFFIX = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def _cfg(**spec) -> TrialConfig:
    return TrialConfig(speculative_config=spec)


def _knobs(cfg: TrialConfig) -> dict:
    return {k: v for k, v in cfg.speculative_config.items() if k != "method"}


def test_a_suffix_point_has_one_neighbour_per_knob_and_direction():
    sp = spaces.load("default")
    got = candidates.neighbours(sp, [_cfg(**SUFFIX)])
    moved = sorted((k, v) for c in got for k, v in _knobs(c).items() if v != SUFFIX[k])
    assert moved == [("num_speculative_tokens", 4), ("num_speculative_tokens", 12),
                     ("suffix_decoding_max_spec_factor", 0.5),
                     ("suffix_decoding_max_spec_factor", 1.5),
                     ("suffix_decoding_max_tree_depth", 16),
                     ("suffix_decoding_max_tree_depth", 32),
                     ("suffix_decoding_min_token_prob", 0.05),
                     ("suffix_decoding_min_token_prob", 0.15)]
    assert all(sum(_knobs(c)[k] != SUFFIX[k] for k in _knobs(c)) == 1 for c in got)


def test_neighbours_stay_inside_the_grid_and_its_dependent_bounds():
    sp = spaces.load("default")
    corner = {**SUFFIX, "num_speculative_tokens": 4, "suffix_decoding_min_token_prob": 0.05}
    got = candidates.neighbours(sp, [_cfg(**corner)])
    assert len(got) == 6  # K and min_prob at their lowest: one direction each
    # n-gram: prompt_lookup_min <= prompt_lookup_max; min 3 = max 3 cannot move min up
    ngram = _cfg(method="ngram", num_speculative_tokens=4, prompt_lookup_max=3,
                 prompt_lookup_min=3)
    got = {(c.speculative_config["prompt_lookup_min"], c.speculative_config["prompt_lookup_max"])
           for c in candidates.neighbours(sp, [ngram])}
    assert (4, 3) not in got and (2, 3) in got and (3, 4) in got
    assert candidates.neighbours(sp, [TrialConfig()]) == []  # the baseline has none


def _fake_predictor(peak: dict):
    """Predicted throughput falls with the grid distance from `peak` (in steps per knob)."""
    steps = {"num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 8,
             "suffix_decoding_max_spec_factor": 0.5, "suffix_decoding_min_token_prob": 0.05}
    calls = []

    def run(configs: list[TrialConfig]) -> Prediction:
        calls.append(len(configs))
        rows = []
        for cfg in configs:
            dist = sum(abs(_knobs(cfg)[k] - peak[k]) / s for k, s in steps.items())
            rows.append(PredictedRow(key=cfg.key(), label=cfg.label(), concurrency=1,
                                     method=cfg.method, pred_output_throughput=100.0 - dist,
                                     speculative_config=json.dumps(cfg.speculative_config)))
        costs = {1: types.SimpleNamespace(calibrated=True)}
        return Prediction(rows=rows, costs=costs, seconds=0.0, configs=len(configs))

    return run, calls


def test_refine_climbs_from_a_sample_to_the_predicted_best_grid_point():
    sp = spaces.load("suffix")
    peak = {"num_speculative_tokens": 28, "suffix_decoding_max_tree_depth": 56,
            "suffix_decoding_max_spec_factor": 2.0, "suffix_decoding_min_token_prob": 0.25}
    start = [c for c in candidates.candidates(sp, seed=3) if _knobs(c) != peak]
    run, calls = _fake_predictor(peak)
    configs, pred, added = candidates.refine(sp, start, run(start), run)
    best = pred.leaders(1, 1)[0]
    assert json.loads(best.speculative_config) == {"method": "suffix", **peak}
    assert added == len(configs) - len(start) > 0
    assert len({c.key() for c in configs}) == len(configs)  # nothing replayed twice
    assert len(calls) - 1 <= candidates.REFINE_ROUNDS
    assert sum(calls[1:]) == added  # each round predicts only the configs it adds
    assert pred.configs == len(configs) and len(pred.rows) == len(configs)
    assert added < 400  # a climb, not the whole grid of 1,536


def test_refine_needs_a_calibrated_step_cost():
    sp = spaces.load("suffix")
    start = candidates.candidates(sp, seed=0)
    run, calls = _fake_predictor({"num_speculative_tokens": 32,
                                  "suffix_decoding_max_tree_depth": 64,
                                  "suffix_decoding_max_spec_factor": 2.0,
                                  "suffix_decoding_min_token_prob": 0.3})
    flat = run(start)
    flat.costs = {1: types.SimpleNamespace(calibrated=False)}
    configs, pred, added = candidates.refine(sp, start, flat, run)
    assert (configs, pred, added) == (start, flat, 0) and len(calls) == 1


def test_the_climb_adds_fewer_configs_over_larger_captures():
    import numpy as np

    from tuner.tokens import RequestTokens, TokenCapture

    def capture(tokens_per_request: int) -> TokenCapture:
        return TokenCapture(requests=tuple(
            RequestTokens(concurrency=1, index=i, warmup=False, prompt=np.arange(8),
                          output=np.arange(tokens_per_request), max_tokens=tokens_per_request)
            for i in range(64)))

    assert candidates.refine_limit(capture(16)) == candidates.REFINE_MAX  # 1k tokens: the README job
    big = candidates.refine_limit(capture(450))  # 29k tokens: an H200 capture
    assert 1 <= big < candidates.REFINE_MAX
    assert big == candidates.REFINE_TOKENS // (64 * 450)


def test_the_policy_curves_replay_at_the_studys_temperature(monkeypatch, tmp_path):
    # A sampled study's curves must be predicted as a sampled one (no stream of a speculative
    # launch followed, ± per row): the temperature reaches the predictor.
    seen = {}

    def fake_predict(capture, configs, measured, **kw):
        seen.update(kw)
        return Prediction(rows=[PredictedRow(key=configs[0].key(), label="", method="ngram",
                                             concurrency=1, pred_speedup=1.2)],
                          costs={}, seconds=0.0, configs=1)

    monkeypatch.setattr(k_curves, "predict", fake_predict)
    monkeypatch.setattr(k_curves, "_ladder_measured", lambda runs, d: ([], object()))
    limits = types.SimpleNamespace(max_model_len=2048, max_num_seqs=8)
    chosen = _cfg(method="ngram", num_speculative_tokens=1, prompt_lookup_min=1,
                  prompt_lookup_max=3)
    got = k_curves.ladder_predictions([], chosen, study_dir=tmp_path, limits=limits,
                                             temperature=0.8)
    assert got == {1: {1: 1.2}} and seen["temperature"] == 0.8
    k_curves.ladder_predictions([], chosen, study_dir=tmp_path, limits=limits)
    assert seen["temperature"] == 0.0

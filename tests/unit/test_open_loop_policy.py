"""The policy's open-loop check (tuner.analysis.policy): where the band edges are, the rate
and cap each is measured at, the per-edge verdict against the best static K (a difference
inside the spread is no finding), and the merge where the schedule dips; on synthetic runs."""

from __future__ import annotations

import math

import pytest

from tuner.analysis import policy as rules
from tuner.outputs.console import open_loop_lines
from tuner.records.configs import TrialConfig

SCHEDULE = [(1, 2, 5), (3, 6, 2), (7, 128, 0)]
CHOSEN = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                         "prompt_lookup_max": 3, "prompt_lookup_min": 2})


def _runs(key: str, figures: dict[int, list[float]]) -> list[dict]:
    """Stored runs of one config, one per repeat, with these output throughputs per level."""
    n = max(len(xs) for xs in figures.values())
    return [{"key": key, "result": {"levels": [
        {"concurrency": c, "output_throughput": xs[i], "request_throughput": xs[i] / 10}
        for c, xs in figures.items() if i < len(xs)]}} for i in range(n)]


def test_edges_are_where_k_changes():
    assert rules.band_edges(SCHEDULE) == [{"edge": 2, "k_below": 5, "k_above": 2},
                                          {"edge": 6, "k_below": 2, "k_above": 0}]
    assert rules.band_edges([(1, 128, 4)]) == []


def test_each_edge_is_driven_at_the_closed_loop_rate_there_capped_above_it():
    # Request throughput (req/s) per ladder level, two runs each.
    closed = {1: [1.0, 1.0], 2: [2.0, 2.0], 4: [3.0, 3.0], 8: [4.0, 4.0]}
    plan = rules.open_loop_plan(SCHEDULE, closed)
    assert [(e["edge"], e["concurrency"]) for e in plan] == [(2, 4), (6, 8)]
    # Edge 2|3: log2-interpolated at 2.5 between levels 2 and 4.
    expect = 2.0 + (math.log2(2.5) - 1.0) * (3.0 - 2.0)
    assert plan[0]["rate"] == pytest.approx(expect, abs=1e-4)
    assert plan[0]["rate_from"] == [2, 4]
    # No ladder level above an edge: nothing to cross it with.
    assert rules.open_loop_plan([(1, 8, 5), (9, 128, 0)], closed) == []


def test_runs_are_the_schedule_and_every_k_of_the_edges():
    plan = rules.open_loop_plan(SCHEDULE, {1: [1.0], 2: [2.0], 4: [3.0], 8: [4.0]})
    policy_cfg = CHOSEN.model_copy(update={"speculative_config": {
        **CHOSEN.speculative_config,
        "num_speculative_tokens_per_batch_size": [list(b) for b in SCHEDULE]}})
    runs, keys = rules.open_loop_runs(plan, policy_cfg, CHOSEN)
    assert [r for r, _ in runs] == ["policy", "static", "static", "baseline"]
    assert [c.k for _, c in runs[1:]] == [5, 2, None]
    assert keys[5] == CHOSEN.key() and keys[0] == TrialConfig().key()


def _check(policy: list[float], k_below: list[float], k_above: list[float]) -> dict:
    plan = [{"edge": 2, "k_below": 5, "k_above": 0, "concurrency": 4, "rate": 3.0,
             "rate_from": [2, 4]}]
    runs = (_runs("P", {4: policy}) + _runs("K5", {4: k_below}) + _runs("B", {4: k_above}))
    return rules.open_loop_check(plan, runs, policy_key="P", static_keys={5: "K5", 0: "B"})[0]


def test_a_dip_beyond_the_spread_is_a_finding():
    row = _check([70.0, 71.0, 69.0], [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert row["best_k"] == 5 and row["dips"] is True
    assert row["ratio"] == pytest.approx(0.70, abs=1e-3)
    assert row["policy"]["throughput"] == 70.0 and row["static"]["5"]["throughput"] == 100.0


def test_a_difference_inside_the_spread_is_not():
    # 4 % below, with a spread of 5 % (one run each: UNMEASURED_NOISE).
    row = _check([96.0], [100.0], [80.0])
    assert row["dips"] is False and row["noise"] == pytest.approx(rules.UNMEASURED_NOISE)
    # Noisy repeats: 10 % below with a 12 % spread.
    row = _check([90.0, 78.0, 102.0], [100.0, 100.0, 100.0], [50.0, 50.0, 50.0])
    assert row["dips"] is False


def test_an_edge_without_both_static_runs_has_no_verdict():
    plan = [{"edge": 2, "k_below": 5, "k_above": 0, "concurrency": 4, "rate": 3.0,
             "rate_from": [2, 4]}]
    row = rules.open_loop_check(plan, _runs("P", {4: [70.0]}) + _runs("K5", {4: [100.0]}),
                                policy_key="P", static_keys={5: "K5", 0: "B"})[0]
    assert row["dips"] is None and row["best_k"] is None


def test_merge_at_a_dip_takes_the_better_k_and_keeps_k_non_increasing():
    edges = [{"edge": 2, "dips": True, "best_k": 2}, {"edge": 6, "dips": False}]
    assert rules.merged_at_dips(SCHEDULE, edges) == [(1, 6, 2), (7, 128, 0)]
    edges = [{"edge": 2, "dips": False}, {"edge": 6, "dips": True, "best_k": 2}]
    assert rules.merged_at_dips(SCHEDULE, edges) == [(1, 2, 5), (3, 128, 2)]
    # Both edges dip: left to right, each merged K between its neighbours'.
    edges = [{"edge": 2, "dips": True, "best_k": 5}, {"edge": 6, "dips": True, "best_k": 0}]
    assert rules.merged_at_dips(SCHEDULE, edges) == [(1, 128, 0)]
    edges = [{"edge": 2, "dips": True, "best_k": 5}, {"edge": 6, "dips": True, "best_k": 5}]
    assert rules.merged_at_dips(SCHEDULE, edges) == [(1, 128, 5)]
    assert rules.merged_at_dips(SCHEDULE, [{"edge": 2, "dips": None}]) == SCHEDULE


def _doc() -> dict:
    spec = {**CHOSEN.speculative_config,
            "num_speculative_tokens_per_batch_size": [[1, 2, 5], [3, 128, 0]]}
    return {"schedule": [[1, 2, 5], [3, 128, 0]], "bands": [[1, 2, 5], [3, 128, 0]],
            "speculative_config": spec, "chosen": CHOSEN.label()}


def test_a_dipping_edge_revises_the_schedule_and_the_document_says_so():
    row = {**_check([70.0, 71.0], [100.0, 101.0], [90.0, 91.0]), "edge": 2}
    doc = rules.with_open_loop(_doc(), [row], CHOSEN.speculative_config)
    block = doc["open_loop"]
    assert block["revised"] and block["dipped_at"] == [2]
    assert block["schedule_verified"] == [[1, 2, 5], [3, 128, 0]]
    # One K left everywhere: a static config, no per-batch-size schedule.
    assert doc["schedule"] == [[1, 128, 5]] == block["schedule_revised"]
    assert doc["speculative_config"] == {**CHOSEN.speculative_config,
                                         "num_speculative_tokens": 5}
    text = "\n".join(open_loop_lines(doc))
    assert "edge 2/3 (K 5 to 0)" in text and "dips beyond the spread" in text
    assert "70.5" in text and "100.5" in text and "merged" in text


def test_a_holding_schedule_is_left_as_it_is():
    row = _check([99.0, 100.0], [100.0, 101.0], [90.0, 91.0])
    doc = rules.with_open_loop(_doc(), [row], CHOSEN.speculative_config)
    assert not doc["open_loop"]["revised"] and doc["schedule"] == _doc()["schedule"]
    assert doc["speculative_config"] == _doc()["speculative_config"]
    lines = open_loop_lines(doc)
    assert "no dip beyond the spread" in lines[1] and "holds at every edge" in lines[-1]

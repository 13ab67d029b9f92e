"""The policy's open-loop check (tuner.analysis.open_loop): where the band edges are, the rate
and cap each is measured at, the per-edge verdict against the best static K (a difference
inside the spread is no finding), and the merge where the schedule dips; on synthetic runs."""

from __future__ import annotations

import math

import pytest
from study_fakes import ladder_runs

from tuner.analysis import ladder_stats as LS
from tuner.analysis import open_loop as OL
from tuner.outputs.console import open_loop_lines
from tuner.records.configs import TrialConfig
from tuner.records.policy import (
    BandEdge,
    EdgeCheck,
    LevelSpeedup,
    MergeCost,
    OpenLoopLevel,
    PolicyDocument,
)

SCHEDULE = [(1, 2, 5), (3, 6, 2), (7, 128, 0)]
CHOSEN = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                         "prompt_lookup_max": 3, "prompt_lookup_min": 2})


def test_edges_are_where_k_changes():
    assert OL.band_edges(SCHEDULE) == [BandEdge(edge=2, k_below=5, k_above=2),
                                          BandEdge(edge=6, k_below=2, k_above=0)]
    assert OL.band_edges([(1, 128, 4)]) == []


def test_each_edge_is_driven_at_the_closed_loop_rate_there_capped_above_it():
    # Request throughput (req/s) per ladder level, two runs each.
    closed = {1: [1.0, 1.0], 2: [2.0, 2.0], 4: [3.0, 3.0], 8: [4.0, 4.0]}
    plan = OL.open_loop_plan(SCHEDULE, closed)
    assert [(e.edge, e.concurrency) for e in plan] == [(2, 4), (6, 8)]
    # Edge 2|3: log2-interpolated at 2.5 between levels 2 and 4.
    expect = 2.0 + (math.log2(2.5) - 1.0) * (3.0 - 2.0)
    assert plan[0].rate == pytest.approx(expect, abs=1e-4)
    assert plan[0].rate_from == (2, 4)
    # No ladder level above an edge: nothing to cross it with.
    assert OL.open_loop_plan([(1, 8, 5), (9, 128, 0)], closed) == []


def test_the_lineup_is_the_schedule_and_every_k_of_the_edges():
    plan = OL.open_loop_plan(SCHEDULE, {1: [1.0], 2: [2.0], 4: [3.0], 8: [4.0]})
    policy_cfg = CHOSEN.model_copy(update={"speculative_config": {
        **CHOSEN.speculative_config,
        "num_speculative_tokens_per_batch_size": [list(b) for b in SCHEDULE]}})
    lineup, keys = OL.open_loop_lineup(plan, policy_cfg, CHOSEN)
    assert [r for r, _ in lineup] == ["policy", "static", "static", "baseline"]
    assert [c.k for _, c in lineup[1:]] == [5, 2, None]
    assert keys[5] == CHOSEN.key() and keys[0] == TrialConfig().key()


PLAN = [OpenLoopLevel(edge=2, k_below=5, k_above=0, concurrency=4, rate=3.0, rate_from=(2, 4))]


def _check(policy: list[float], k_below: list[float], k_above: list[float]) -> EdgeCheck:
    runs = (ladder_runs("P", {4: policy}) + ladder_runs("K5", {4: k_below})
            + ladder_runs("B", {4: k_above}))
    return OL.open_loop_check(PLAN, runs, policy_key="P", static_keys={5: "K5", 0: "B"})[0]


def test_a_dip_beyond_the_spread_is_a_finding():
    row = _check([70.0, 71.0, 69.0], [100.0, 101.0, 99.0], [90.0, 91.0, 89.0])
    assert row.best_k == 5 and row.dips is True
    assert row.ratio == pytest.approx(0.70, abs=1e-3)
    assert row.policy.throughput == 70.0 and row.static[5].throughput == 100.0
    assert row.policy.mean_tpot_ms == pytest.approx(1000.0 / 70.0, abs=1e-3)


def test_a_difference_inside_the_spread_is_not():
    # 8 % below, with a spread of 5 % each (one run each: UNMEASURED_NOISE): 10 % in all.
    row = _check([92.0], [100.0], [80.0])
    assert row.dips is False and row.noise == pytest.approx(2 * LS.UNMEASURED_NOISE)
    # Two runs each, 1.5 % below: each median is known to 1 % at best (the MAD floor).
    row = _check([98.5, 98.5], [100.0, 100.0], [50.0, 50.0])
    assert row.dips is False and row.noise == pytest.approx(0.02)
    # Noisy repeats: 10 % below with a 12 % spread.
    row = _check([90.0, 78.0, 102.0], [100.0, 100.0, 100.0], [50.0, 50.0, 50.0])
    assert row.dips is False


def test_an_edge_without_both_static_runs_has_no_verdict():
    runs = ladder_runs("P", {4: [70.0]}) + ladder_runs("K5", {4: [100.0]})
    row = OL.open_loop_check(PLAN, runs, policy_key="P", static_keys={5: "K5", 0: "B"})[0]
    assert row.dips is None and row.best_k is None
    # Not measured: its JSON has no difference and no merge cost (policy.json as before).
    assert not {"policy_minus_best", "gives_up"} & set(row.model_dump())


def _edge(edge: int, dips: bool | None, best_k: int | None = None) -> EdgeCheck:
    """A checked edge of SCHEDULE with only what the merge reads."""
    return EdgeCheck(edge=edge, k_below=0, k_above=0, concurrency=edge + 1, rate=1.0,
                     rate_from=(1, 2), dips=dips, best_k=best_k)


def test_merge_at_a_dip_takes_the_better_k_and_keeps_k_non_increasing():
    edges = [_edge(2, True, 2), _edge(6, False)]
    assert OL.merged_at_dips(SCHEDULE, edges) == [(1, 6, 2), (7, 128, 0)]
    edges = [_edge(2, False), _edge(6, True, 2)]
    assert OL.merged_at_dips(SCHEDULE, edges) == [(1, 2, 5), (3, 128, 2)]
    # Both edges dip: left to right, each merged K between its neighbours'.
    edges = [_edge(2, True, 5), _edge(6, True, 0)]
    assert OL.merged_at_dips(SCHEDULE, edges) == [(1, 128, 0)]
    edges = [_edge(2, True, 5), _edge(6, True, 5)]
    assert OL.merged_at_dips(SCHEDULE, edges) == [(1, 128, 5)]
    assert OL.merged_at_dips(SCHEDULE, [_edge(2, None)]) == SCHEDULE


def _doc(**fields) -> PolicyDocument:
    spec = {**CHOSEN.speculative_config,
            "num_speculative_tokens_per_batch_size": [[1, 2, 5], [3, 128, 0]]}
    return PolicyDocument(method="ngram", chosen=CHOSEN.label(),
                          schedule=((1, 2, 5), (3, 128, 0)), bands=((1, 2, 5), (3, 128, 0)),
                          speculative_config=spec, **fields)


def test_a_dipping_edge_revises_the_schedule_and_the_document_says_so():
    row = _check([70.0, 71.0], [100.0, 101.0], [90.0, 91.0])
    assert row.edge == 2
    doc = OL.with_open_loop(_doc(), [row], CHOSEN)
    block = doc.open_loop
    assert block.revised and block.dipped_at == (2,)
    assert block.schedule_verified == ((1, 2, 5), (3, 128, 0))
    # One K left everywhere: a static config, no per-batch-size schedule.
    assert doc.schedule == ((1, 128, 5),) == block.schedule_revised
    assert doc.speculative_config == {**CHOSEN.speculative_config, "num_speculative_tokens": 5}
    text = "\n".join(open_loop_lines(doc))
    assert "edge 2/3 (K 5 to 0)" in text and "dips beyond the spread" in text
    assert "70.5" in text and "100.5" in text and "merged" in text


def test_a_holding_schedule_is_left_as_it_is():
    row = _check([99.0, 100.0], [100.0, 101.0], [90.0, 91.0])
    doc = OL.with_open_loop(_doc(), [row], CHOSEN)
    assert not doc.open_loop.revised and doc.schedule == _doc().schedule
    assert doc.speculative_config == _doc().speculative_config
    lines = open_loop_lines(doc)
    assert "no dip beyond the spread" in lines[1] and "holds at every edge" in lines[-1]


K_STATS = {k: {c: LevelSpeedup(speedup=s, noise=0.05) for c, s in curve.items()}
           for k, curve in {5: {1: 2.0, 4: 1.30, 16: 0.70}, 2: {1: 1.6, 4: 1.28, 16: 0.98}}.items()}


def test_a_merge_that_would_give_up_a_closed_loop_gain_is_not_made():
    schedule = [(1, 2, 5), (3, 8, 2), (9, 128, 0)]
    # Into K=0 over the K=2 band: K=2 measured 1.28x at 4, K=0 is 1.00x.
    cost = OL.merge_cost(schedule, K_STATS, edge=8, best_k=0)
    assert cost == MergeCost(concurrency=4, k=2, speedup=1.28, merged_k=0, merged_speedup=1.0)
    # Into K=2 over the K=0 band: K=2 at 16 is 0.98x against 1.00x, within the noise.
    assert OL.merge_cost(schedule, K_STATS, edge=8, best_k=2) is None
    # Into K=5 over the K=0 band: K=5 at 16 is 0.70x, below K=0's 1.00x.
    assert OL.merge_cost([(1, 2, 5), (3, 128, 0)], K_STATS, edge=2, best_k=5) == MergeCost(
        concurrency=16, k=0, speedup=1.0, merged_k=5, merged_speedup=0.7)
    # Into K=5 over the K=2 band: 1.30x against 1.28x at 4, within the noise: no loss.
    assert OL.merge_cost(schedule, K_STATS, edge=2, best_k=5) is None


def test_a_dipping_edge_whose_merge_gives_up_a_gain_is_kept_and_said():
    doc = _doc(k_stats=K_STATS)
    row = _check([70.0, 71.0], [60.0, 61.0], [100.0, 101.0])
    assert row.dips and row.best_k == 0
    out = OL.with_open_loop(doc, [row], CHOSEN)
    block = out.open_loop
    assert block.dipped_at == (2,) and block.kept_at == (2,) and not block.revised
    assert out.schedule == doc.schedule
    assert block.edges[0].gives_up.concurrency == 1
    text = "\n".join(open_loop_lines(out))
    assert "kept: merging into K=0 would give up the closed-loop 2.00x of K=5 at concurrency 1" \
        in text and "holds at every edge" not in text


def test_the_open_loop_phase_measures_only_the_edge_levels_at_their_rates(tmp_path,
                                                                          monkeypatch):
    import optuna
    from study_fakes import fake_level, fake_study

    from tuner.measure.trial import OpenLoopSettings
    from tuner.records.configs import EngineSpec, MeasureSettings, Workload, WorkloadSpec
    from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
    from tuner.records.trials import TrialOutcome
    from tuner.search import ladder

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    said: list[str] = []
    campaign = ladder.Campaign(
        study=fake_study(concurrencies=(1, 2, 4)), engine=EngineSpec(model="fake"),
        workload=Workload(spec=WorkloadSpec(name="random"), prompts=()),
        settings=MeasureSettings(concurrencies=(1, 2, 4)), repeats=2, out_dir=tmp_path,
        say=said.append)
    rates = {4: 3.5, 2: 1.25}
    seen: list[OpenLoopSettings] = []

    def measure_run(self, config, run_dir) -> TrialOutcome:
        seen.append(self.settings)  # what Campaign.measure_run hands tuner.measure
        levels = tuple(LevelMetrics.model_validate(
            {**fake_level(c, output_throughput=50.0, mean_tpot_ms=10.0), "request_rate": r})
            for c, r in sorted(rates.items()))
        return TrialOutcome(result=BenchResult(config=config, engine=EngineInfo(start_s=1.0),
                                               levels=levels))

    monkeypatch.setattr(ladder.Campaign, "measure_run", measure_run)
    runs = ladder.measure_open_loop(campaign, lineup=[("policy", CHOSEN)], rates=rates)
    assert len(seen) == 2 and all(isinstance(s, OpenLoopSettings) and s.concurrencies == (2, 4)
                                  and s.request_rates == rates for s in seen)
    assert [r.phase for r in runs] == ["open_loop"] * 2
    assert said[0] == (f"  [open_loop 1/2] {CHOSEN.label()}: c=2 at 1.25 req/s 50.0 tok/s | "
                       "c=4 at 3.50 req/s 50.0 tok/s")
    comp = ladder.companion(campaign.study)
    assert comp.trials[0].user_attrs["request_rates"] == {"2": 1.25, "4": 3.5}
    # A closed-loop level dumps as before: no request_rate key.
    closed = LevelMetrics.model_validate(fake_level(1, output_throughput=1.0, mean_tpot_ms=1.0))
    assert "request_rate" not in closed.model_dump() and closed.request_rate is None

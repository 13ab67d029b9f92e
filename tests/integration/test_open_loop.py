"""Open-loop arrivals on the fake engine: the load generator sends each request at its seeded
Poisson time (`vllm bench serve --request-rate`) and never more than c at once; the policy's
verify step measures the schedule and the static Ks of its bands that way at every band edge,
reports each edge, and merges the bands where the schedule dips beyond the spread.

Every engine here serves on a virtual clock (tuner.testing.fake_clock) that the load generator
reads too: a request is sent exactly at its arrival, however loaded the host is."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from conftest import fake_engine_spec

from tuner import api
from tuner.measure import load_level, loadgen
from tuner.measure.trial import OpenLoopSettings
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions, PolicyOptions
from tuner.records.results import BenchResult
from tuner.records.trials import TrialOutcome
from tuner.search import ladder


def _settings(eng, rate: float | None) -> load_level.RequestSettings:
    return load_level.RequestSettings(model=eng.spec.served_model_name, api_key=eng.api_key,
                                   request_timeout_s=10.0, request_rate=rate, arrival_seed=7)


def _reset(eng) -> None:
    urllib.request.urlopen(urllib.request.Request(eng.url + "/fake/reset_stats", method="POST",
                                                  data=b""), timeout=5)


def test_arrival_times_are_vllm_bench_serves():
    # vLLM: np.random.seed(seed), a gamma(1, 1/rate) gap per request, summed, then scaled so
    # the last request arrives at n / rate.
    np.random.seed(3)
    gaps = [np.random.gamma(shape=1.0, scale=1.0 / 2.5) for _ in range(20)]
    times = np.cumsum(gaps) * (20 / 2.5) / np.sum(gaps)
    assert load_level.poisson_arrivals(20, 2.5, 3) == pytest.approx(tuple(times), abs=1e-12)
    assert load_level.poisson_arrivals(20, 2.5, 3) != load_level.poisson_arrivals(20, 2.5, 4)
    with pytest.raises(ValueError):
        load_level.poisson_arrivals(3, 0.0)


@pytest.mark.parametrize("processes", [1, 2])
def test_requests_are_sent_at_their_poisson_times(fake_engine, make_prompts, fake_stats,
                                                  processes, virtual_clock):
    n, rate = 12, 25.0
    # 12 ms a request (5 ms, then 7 tokens of 1 ms), at most 4 in flight.
    with fake_engine(ttft_ms=5, tpot_ms=1, virtual_clock=virtual_clock.path) as eng:
        _reset(eng)
        records, wall_s = loadgen.run_requests(eng.url, make_prompts(n), _settings(eng, rate),
                                               concurrency=4, processes=processes)
        stats = fake_stats(eng.url)
    arrivals = load_level.poisson_arrivals(n, rate, 7)
    assert [r.index for r in records] == list(range(n)) and all(r.ok for r in records)
    # Every request at its arrival (start_s is kept to the microsecond); the last one ends
    # its 12 ms after its own.
    assert [r.start_s for r in records] == pytest.approx(arrivals, abs=1e-6)
    assert wall_s == pytest.approx(arrivals[-1] + 0.012, abs=1e-6)
    assert stats["fake:requests_total"] == n and stats["fake:max_inflight"] <= 4


def test_open_loop_never_has_more_than_c_in_flight(fake_engine, make_prompts, fake_stats,
                                                   virtual_clock):
    n, c = 9, 3
    # 135 ms a request, arrivals about 5 ms apart.
    with fake_engine(ttft_ms=100, tpot_ms=5, virtual_clock=virtual_clock.path) as eng:
        _reset(eng)
        records, _ = loadgen.run_requests(eng.url, make_prompts(n), _settings(eng, 200.0),
                                          concurrency=c)
        assert fake_stats(eng.url)["fake:max_inflight"] == c
    arrivals = load_level.poisson_arrivals(n, 200.0, 7)
    spans = [(r.start_s, r.start_s + r.e2e_s) for r in records]
    for i, (start, _) in enumerate(spans):
        assert start >= arrivals[i] - 1e-6
        assert sum(s <= start < e for j, (s, e) in enumerate(spans) if j != i) <= c - 1
    # Queued: request c was sent the moment the first ended, as vLLM's --max-concurrency
    # semaphore lets it, well after its arrival.
    assert spans[c][0] == pytest.approx(min(e for _, e in spans[:c]), abs=1e-6)
    assert spans[c][0] > arrivals[c] + 0.05


def _study(tmp_path, clock):
    engine = fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=6,
                              accept_rate=0.6, load_per_seq=0.05, verify_cost_per_token=0.06,
                              virtual_clock=clock.path)
    out = tmp_path / "study"
    api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=4, output_len=24),
        space_name="ngram", settings=MeasureSettings(concurrencies=(1,)),
        out_dir=out, study_name="p", n_trials=3,
        objectives=["output_throughput", "mean_tpot_ms"], target_concurrency=1,
        constraints={}), engine=engine, say=lambda _m: None)
    return out


POLICY = PolicyOptions(ladder=(1, 4, 16), repeats=1, leaders=1, k_values=(5,))


def test_verify_measures_every_band_edge_open_loop(tmp_path, virtual_clock):
    out = _study(tmp_path, virtual_clock)
    said: list[str] = []
    doc = api.policy(POLICY, study_dir=out, say=said.append)
    assert doc.verification.honoured
    block = doc.open_loop
    edges = block.edges
    assert [e.edge for e in edges] == [s[1] for s in block.schedule_verified[:-1]]
    for e in edges:
        assert e.concurrency > e.edge and e.rate > 0
        assert e.policy.throughput > 0 and len(e.static) == 2
        assert e.dips is not None and e.best_k in (e.k_below, e.k_above)
    # Each open-loop level records its rate; the runs are a phase of the ladder's companion.
    from tuner.search import study as st

    runs = ladder.stored_runs(st.open_existing(out, None, None), ladder.OPEN_LOOP)
    ks = {k for e in edges for k in (e.k_below, e.k_above)}
    assert sorted(r.role for r in runs) == sorted(
        ["policy"] + ["baseline" if k == 0 else "static" for k in ks])
    rates = {e.concurrency: e.rate for e in edges}
    for r in runs:
        assert {lv.concurrency: lv.request_rate for lv in r.result.levels} == rates
    assert any(f"[open_loop 1/{len(runs)}]" in m and "req/s" in m for m in said)
    text = (out / "report.md").read_text()
    assert "open-loop check" in text and f"edge {edges[0].edge}/" in text


def test_a_dip_at_an_edge_merges_its_bands(tmp_path, monkeypatch, virtual_clock):
    out = _study(tmp_path, virtual_clock)
    real = ladder.Campaign.measure_run

    def dips_when_k_flips(self, config, run_dir) -> TrialOutcome:
        # Fault injection: under open-loop arrivals the schedule loses 40% of its throughput
        # (as where K flip-flops at a band edge), the static configs measure as they are.
        outcome = real(self, config, run_dir)
        flips = "num_speculative_tokens_per_batch_size" in (config.speculative_config or {})
        if not (isinstance(self.settings, OpenLoopSettings) and flips and outcome.result):
            return outcome
        levels = tuple(lv.model_copy(update={"output_throughput": 0.6 * lv.output_throughput})
                       for lv in outcome.result.levels)
        return outcome.model_copy(update={"result": BenchResult(
            config=outcome.result.config, engine=outcome.result.engine, levels=levels)})

    monkeypatch.setattr(ladder.Campaign, "measure_run", dips_when_k_flips)
    doc = api.policy(POLICY, study_dir=out, say=lambda _m: None)
    block = doc.open_loop
    assert block.dipped_at == tuple(e.edge for e in block.edges)
    assert all(e.dips and e.ratio < 1 - e.noise for e in block.edges)
    # Each dipping edge is merged into its better K, unless that gives up a closed-loop gain
    # (then it is kept, and says what it would give up).
    kept = tuple(e.edge for e in block.edges if e.gives_up)
    assert block.kept_at == kept
    assert block.revised == (len(kept) < len(block.edges))
    assert doc.schedule == (block.schedule_revised if block.revised
                            else block.schedule_verified)
    for e in block.edges:
        if e.gives_up:
            assert e.gives_up.merged_k == e.best_k
            assert e.gives_up.speedup > (e.gives_up.merged_speedup or 0)

"""`tuner policy` end to end on the fake engine with a load model in which speculation pays
at low concurrency and loses at high: the ladder, break-even, the emitted schedule, and its
verification (the fake honours num_speculative_tokens_per_batch_size as vLLM does).

The study and its policy run once for the file, on a virtual clock (tuner.testing.fake_clock):
every throughput they measure is the load model's to the float, so the ratios checked below
hold on any host under any load. Each test checks one thing of that one run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import fake_engine_spec

from tuner import api
from tuner.engine_cmdline import EMBEDDED_HUB_ID, EMBEDDED_SERVE_NOTE
from tuner.measure import loadgen_clock
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions, PolicyOptions
from tuner.records.policy import BreakEvenStatus, PolicyDocument
from tuner.testing.fake_clock import VirtualClock

# The load model (tuner.testing.fake_engine.FakeScript): a step of a batch of c takes
# TPOT_MS * (1 + LOAD_PER_SEQ * (c - 1)), times (1 + VERIFY_COST * K * c) under speculation,
# where it yields 1 + K * ACCEPT tokens. For K=5 the step's speedup is 4 / (1 + 0.3 c): it
# pays at 1-2 and loses from c = 10.
TTFT_MS, TPOT_MS, ACCEPT, LOAD_PER_SEQ, VERIFY_COST, OUTPUT_LEN = 5, 6, 0.6, 0.05, 0.06, 24
LADDER = (1, 2, 4, 8, 16)


def model_speedup(k: int, c: int) -> float:
    """Throughput of K over no speculation at a closed-loop batch of c, all requests in step:
    one TTFT and OUTPUT_LEN - 1 steps each."""
    base = TPOT_MS * (1 + LOAD_PER_SEQ * (c - 1))
    spec = base * (1 + VERIFY_COST * k * c) / (1 + k * ACCEPT)
    return (TTFT_MS + (OUTPUT_LEN - 1) * base) / (TTFT_MS + (OUTPUT_LEN - 1) * spec)


@dataclass(frozen=True)
class Run:
    out: Path
    doc: PolicyDocument
    noise_dir: Path


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Run:
    """One study (3 trials) and its policy on the ladder 1-16, with --k-values 5,2."""
    tmp = tmp_path_factory.mktemp("policy-flow")
    clock = VirtualClock.create(tmp / "virtual-clock")
    # Named as the embedded default is: its serve command names the hub id, with a note.
    engine = fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=TTFT_MS,
                              tpot_ms=TPOT_MS, accept_rate=ACCEPT, load_per_seq=LOAD_PER_SEQ,
                              verify_cost_per_token=VERIFY_COST, model_name=EMBEDDED_HUB_ID,
                              virtual_clock=clock.path)
    out, noise_dir = tmp / "study", tmp / "noise-profile"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loadgen_clock, "clock", clock)
        # As the autouse fixture does per test: a noise profile of this run's own.
        mp.setenv("SPEC_TUNER_NOISE_DIR", str(noise_dir))
        api.optimize(OptimizeOptions(
            workload=WorkloadSpec(name="instructcoder", num_prompts=4, output_len=OUTPUT_LEN),
            space_name="ngram", settings=MeasureSettings(concurrencies=(1,)),
            out_dir=out, study_name="p", n_trials=3,
            objectives=["output_throughput", "mean_tpot_ms"], target_concurrency=1,
            constraints={}), engine=engine, say=lambda _m: None)
        doc = api.policy(PolicyOptions(ladder=LADDER, repeats=2, leaders=1, k_values=(5, 2)),
                         study_dir=out, say=lambda _m: None)
    return Run(out=out, doc=doc, noise_dir=noise_dir)


def _k5(doc: PolicyDocument):
    return next(c for c in doc.configs if "k=5" in c.label)


def _schedule(doc: PolicyDocument) -> list[list[int]]:
    return [list(b) for b in doc.schedule]


def test_k5_crosses_break_even_where_the_model_does(run) -> None:
    # The model's K=5 speedup falls below 1 between ladder levels 8 and 16.
    assert model_speedup(5, 8) > 1 > model_speedup(5, 16)
    be = _k5(run.doc).break_even
    assert be.status is BreakEvenStatus.CROSSES
    assert 8 <= be.concurrency <= 16


def test_schedule_speculates_at_1_and_stops_at_the_top(run) -> None:
    sched = _schedule(run.doc)
    assert sched[0][0] == 1 and sched[0][2] > 0 and sched[-1][2] == 0
    assert not run.doc.schedule_problems


def test_the_replay_predicts_every_k_below_the_leaders_and_keeps_measured_ones(run) -> None:
    doc = run.doc
    k_top = max(doc.k_measured)  # the leader's own K, with the --k-values 5 and 2
    assert {2, 5} <= set(doc.k_measured)
    assert set(doc.predicted_speedups) == set(range(1, k_top + 1))
    assert not set(doc.k_predicted) & set(doc.k_measured)


def test_the_speculative_config_carries_the_schedule(run) -> None:
    spec = run.doc.speculative_config
    assert spec["num_speculative_tokens_per_batch_size"] == _schedule(run.doc)


def test_verification_finds_the_schedule_honoured_and_nowhere_worse(run) -> None:
    ver = run.doc.verification
    assert not ver.engine_rejected and ver.honoured
    assert not ver.worse_at, ver.rows


def _k_at(schedule: list[list[int]], c: int) -> int:
    return next(k for lo, hi, k in schedule if lo <= c <= hi)


def test_ladder_speedups_are_the_models(run) -> None:
    # Every speculative config at every level, against no speculation, on the virtual clock.
    measured = [c for c in run.doc.configs if c.speculative_config]
    assert len(measured) >= 3
    for config in measured:
        k = config.speculative_config["num_speculative_tokens"]
        assert set(config.stats) == set(LADDER), config.label
        for c, stat in config.stats.items():
            assert stat.speedup == pytest.approx(model_speedup(k, c), rel=1e-6), (config.label, c)


def test_verified_speedups_are_the_schedules_model(run) -> None:
    rows = run.doc.verification.rows
    sched = _schedule(run.doc)
    assert [r.concurrency for r in rows] == list(LADDER)
    for r in rows:
        k = _k_at(sched, r.concurrency)
        want = model_speedup(k, r.concurrency) if k else 1.0
        assert r.policy_speedup == pytest.approx(want, rel=1e-6), r
    assert rows[0].policy_speedup > 1.5


def test_serve_command_names_the_hub_id_with_its_note(run) -> None:
    assert run.doc.serve_command.startswith(f"vllm serve {EMBEDDED_HUB_ID} --speculative-config")
    assert run.doc.serve_note == EMBEDDED_SERVE_NOTE


def test_policy_plot_is_drawn(run) -> None:
    assert (run.out / "plots" / "policy_speedup.png").exists()


def test_policy_json_reads_back_as_the_document(run) -> None:
    assert PolicyDocument.model_validate(
        json.loads((run.out / "policy.json").read_text())) == run.doc


@pytest.fixture(scope="module")
def resumed(run) -> subprocess.CompletedProcess:
    """`tuner policy` again from the command line, on the stored study."""
    return subprocess.run([sys.executable, "-m", "tuner", "policy", str(run.out), "--ladder",
                           ",".join(map(str, LADDER)), "--policy-repeats", "2", "--leaders",
                           "1", "--k-values", "5,2"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SPEC_TUNER_NOISE_DIR": str(run.noise_dir)})


def test_resuming_the_policy_measures_nothing_new(resumed) -> None:
    assert resumed.returncode == 0, resumed.stderr
    assert "[ladder" not in resumed.stderr and "[verify" not in resumed.stderr


def test_the_report_embeds_the_policy(run, resumed) -> None:
    assert resumed.returncode == 0, resumed.stderr
    assert "Load-aware policy" in (run.out / "report.html").read_text()
    assert f"Note: {EMBEDDED_SERVE_NOTE}." in (run.out / "report.md").read_text()


def test_the_recommendation_carries_the_policy(run, resumed) -> None:
    assert resumed.returncode == 0, resumed.stderr
    rec = json.loads((run.out / "recommendation.json").read_text())
    assert rec["policy"]["schedule"] == _schedule(run.doc)
    assert rec["policy"]["serve_note"] == EMBEDDED_SERVE_NOTE

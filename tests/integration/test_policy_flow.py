"""`tuner policy` end to end on the fake engine with a load model in which speculation pays
at low concurrency and loses at high: the ladder, break-even, the emitted schedule, and its
verification (the fake honours num_speculative_tokens_per_batch_size as vLLM does)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import fake_engine_spec

from tuner import api
from tuner.engine_cmdline import EMBEDDED_HUB_ID, EMBEDDED_SERVE_NOTE
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions, PolicyOptions
from tuner.records.policy import BreakEvenStatus, PolicyDocument


def test_policy_finds_break_even_and_verifies_the_schedule(tmp_path):
    # Named as the embedded default is: its serve command names the hub id, with a note.
    engine = fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=6,
                              accept_rate=0.6, load_per_seq=0.05, verify_cost_per_token=0.06,
                              model_name=EMBEDDED_HUB_ID)
    out = tmp_path / "study"
    api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=4, output_len=24),
        space_name="ngram", settings=MeasureSettings(concurrencies=(1,)),
        out_dir=out, study_name="p", n_trials=3,
        objectives=["output_throughput", "mean_tpot_ms"], target_concurrency=1,
        constraints={}), engine=engine, say=lambda _m: None)
    doc = api.policy(PolicyOptions(ladder=(1, 2, 4, 8, 16), repeats=2, leaders=1,
                                   k_values=(5, 2)), study_dir=out, say=lambda _m: None)
    k5 = next(c for c in doc.configs if "k=5" in c.label)
    # Model: speedup(c) = 4 / (1 + 0.3 c) for K=5: pays at 1-2, loses from about 10.
    assert k5.break_even.status is BreakEvenStatus.CROSSES
    assert 2 <= k5.break_even.concurrency <= 16
    sched = [list(b) for b in doc.schedule]
    assert sched[0][0] == 1 and sched[0][2] > 0 and sched[-1][2] == 0
    assert not doc.schedule_problems
    # The replay predicted every K of the chosen config on the ladder; measured Ks stay.
    k_top = max(doc.k_measured)  # the leader's own K, with the --k-values 5 and 2
    assert {2, 5} <= set(doc.k_measured)
    assert set(doc.predicted_speedups) == set(range(1, k_top + 1))
    assert not set(doc.k_predicted) & set(doc.k_measured)
    spec = doc.speculative_config
    assert spec["num_speculative_tokens_per_batch_size"] == sched
    ver = doc.verification
    assert not ver.engine_rejected and ver.honoured
    assert not ver.worse_at, ver.rows
    assert ver.rows[0].policy_speedup > 1.5
    assert doc.serve_command.startswith(f"vllm serve {EMBEDDED_HUB_ID} --speculative-config")
    assert doc.serve_note == EMBEDDED_SERVE_NOTE
    assert (out / "plots" / "policy_speedup.png").exists()
    # policy.json is the document as returned, read back into the same record.
    assert PolicyDocument.model_validate(json.loads((out / "policy.json").read_text())) == doc
    # The report embeds the policy; resuming the policy step measures nothing new.
    r = subprocess.run([sys.executable, "-m", "tuner", "policy", str(out), "--ladder",
                        "1,2,4,8,16", "--policy-repeats", "2", "--leaders", "1", "--k-values",
                        "5,2"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "[ladder" not in r.stderr and "[verify" not in r.stderr  # answered from storage
    assert "Load-aware policy" in (out / "report.html").read_text()
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["policy"]["schedule"] == sched
    assert rec["policy"]["serve_note"] == EMBEDDED_SERVE_NOTE
    assert f"Note: {EMBEDDED_SERVE_NOTE}." in (out / "report.md").read_text()

"""`tuner optimize --strategy replay` at temperature 0.8 on the fake engine: warned up front
(the fake engine stands for the CPU build), every predicted row carries its sampling error,
and the fake engine's scripted acceptance, which no sampling explains, is said once, noted in
decisions.json and repeated in the recommendation's reason at each level."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import fake_engine_spec

from tuner import api
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.outputs import decisions, verdicts
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.replay import sampling
from tuner.search import study as st

pytestmark = pytest.mark.vllm  # steps vLLM's proposers: fails where vLLM is missing


def test_a_sampled_study_carries_its_error_and_says_what_the_engine_did_not_deliver(tmp_path):
    lines: list[str] = []
    out = tmp_path / "study"
    study = api.optimize(OptimizeOptions(
        workload=WorkloadSpec(name="instructcoder", num_prompts=3, output_len=24,
                              temperature=0.8, top_k=40),

        space_name="ngram", settings=MeasureSettings(concurrencies=(1, 2)), out_dir=out,
        study_name="s", n_trials=3, objectives=["output_throughput", "mean_tpot_ms"],
        target_concurrency=1, constraints={"max_tpot_ms": None, "max_ttft_ms": None},
        strategy="replay"), engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=2), say=lines.append)
    warned = sampling.known_defect(device="cpu", temperature=0.8)
    assert lines.count(warned) == 1 and lines.index(warned) < 3  # up front
    pred = pd.read_csv(out / "predicted.csv")
    spec = pred[pred["method"] == "ngram"]
    assert spec["acceptance_length_pm"].notna().all()
    assert pred[pred["method"] == "none"]["acceptance_length_pm"].isna().all()
    said = [line for line in lines if " tokens per draft step " in line]
    assert len(said) == 1 and said[0].startswith("vLLM 0.0.0+fake (cpu) accepted ")
    meta = st.settings_of(study)
    assert meta.stored()["fingerprint"]["top_k"] == 40 and meta.workload.top_k == 40
    mismatch = meta.sampling_mismatch
    assert set(mismatch) == {"1", "2"}
    noted = [e.text for e in decisions.load_decisions(out) if e.topic == "sampling"]
    assert sorted(noted) == sorted(mismatch.values())
    _, recs = api.report(study_dir=out)
    for rec in recs:
        assert rec.verdict.sampling_mismatch == mismatch[str(rec.concurrency)]
        assert verdicts.reason(rec).endswith(mismatch[str(rec.concurrency)])
        if rec.verify_command:
            assert "--temperature 0.8 --top-k 40" in rec.verify_command

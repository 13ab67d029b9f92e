"""The real vLLM CPU engine with the embedded SmolLM2 model (marked `engine`; about a minute
per launch on 2 cores). These are the measurements everything else stands on."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tuner import api
from tuner.api import engines
from tuner.errors import ConfigError
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import BenchOptions, EngineOptions

pytestmark = pytest.mark.engine

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}


def _vllm_or_skip():
    pytest.importorskip("vllm", reason="the vLLM CPU build is not installed (scripts/setup.sh)")


@pytest.fixture(scope="module")
def engine_spec():
    _vllm_or_skip()
    return engines.resolve_engine(EngineOptions(ready_timeout_s=600))


def _bench(engine_spec, tmp_path_factory, spec):
    out = tmp_path_factory.mktemp("bench")
    wl = WorkloadSpec(name="instructcoder", num_prompts=4, output_len=64)
    result = api.bench(BenchOptions(workload=wl,
                                    config=TrialConfig(speculative_config=spec),
                                    settings=MeasureSettings(concurrencies=(1, 2)), out_dir=out), engine=engine_spec,
                       say=lambda _m: None)
    return result, out


@pytest.fixture(scope="module")
def ngram_run(engine_spec, tmp_path_factory):
    return _bench(engine_spec, tmp_path_factory, NGRAM)


@pytest.fixture(scope="module")
def baseline_run(engine_spec, tmp_path_factory):
    return _bench(engine_spec, tmp_path_factory, None)


def test_ngram_acceptance_counters_are_populated(ngram_run):
    result, _ = ngram_run
    for lv in result.levels:
        assert lv.completed == lv.num_requests >= 4
        assert lv.spec_decode_num_drafts > 0
        assert 0 < lv.spec_decode_accepted_tokens <= lv.spec_decode_draft_tokens
        assert 1.0 < lv.spec_decode_acceptance_length <= 1 + 5
        assert len(lv.spec_decode_per_position_acceptance_rates) == 5
        # Per-position rates cannot grow with the position (a token needs its predecessors).
        rates = lv.spec_decode_per_position_acceptance_rates
        assert all(a >= b - 1e-9 for a, b in zip(rates, rates[1:], strict=False))


def test_the_replay_reproduces_the_engines_acceptance(ngram_run, baseline_run):
    """vLLM's n-gram proposer stepped over recorded tokens gives what the engine counted:
    over the speculative run's own tokens within 3% (drafts past a request's end are counted
    in expectation), and over the baseline's wherever the outputs did not drift apart."""
    from tuner.replay import acceptance
    from tuner.tokens import FILE_NAME, TokenCapture

    (result, out), (_, base_out) = ngram_run, baseline_run
    own = TokenCapture.load(out / FILE_NAME)
    base = TokenCapture.load(base_out / FILE_NAME)
    assert {r.index for r in own.level(1, warmup=False)} == {0, 1, 2, 3}
    from_own = acceptance.replay(own, TrialConfig(speculative_config=NGRAM), max_model_len=4096)
    from_base = acceptance.replay(base, TrialConfig(speculative_config=NGRAM), max_model_len=4096)
    for lv in result.levels:
        c = lv.concurrency
        assert from_own[c].acceptance_length == pytest.approx(
            lv.spec_decode_acceptance_length, rel=0.03)
        same = all(len(a.output) == len(b.output) and (a.output == b.output).all()
                   for a, b in zip(own.level(c, warmup=False), base.level(c, warmup=False),
                                   strict=True))
        if same:
            assert from_base[c].acceptance_length == pytest.approx(
                lv.spec_decode_acceptance_length, rel=0.03)


def test_baseline_has_zero_acceptance(baseline_run):
    result, _ = baseline_run
    for lv in result.levels:
        assert lv.spec_decode_num_drafts == 0 and lv.spec_decode_acceptance_rate is None


def test_token_counts_match_the_per_request_records(ngram_run, baseline_run):
    for result, out in (ngram_run, baseline_run):
        records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
        for lv in result.levels:
            measured = [r for r in records if r["concurrency"] == lv.concurrency
                        and not r["warmup"]]
            assert len(measured) == lv.num_requests
            assert sum(r["output_tokens"] for r in measured) == lv.total_output_tokens
            assert all(1 <= r["output_tokens"] <= 64 for r in measured)
            assert lv.output_throughput == pytest.approx(lv.total_output_tokens / lv.duration)
        stored = json.loads((out / "result.json").read_text())
        assert stored["levels"][0]["output_throughput"] == result.levels[0].output_throughput


def test_no_engine_process_survives_the_run(ngram_run, baseline_run):
    for _, out in (ngram_run, baseline_run):
        log = (out / "engine.log").read_text()
        pids = {int(p) for p in __import__("re").findall(r"pid=(\d+)\)", log)}
        assert pids, "engine.log names vLLM's processes"
        for pid in pids:
            assert not os.path.exists(f"/proc/{pid}") or \
                open(f"/proc/{pid}/stat").read().split()[2] == "Z"


def test_engines_start_forked_and_leave_nothing_in_the_temp_folder(ngram_run, baseline_run):
    """The fast start is the default for this Python's vLLM (tuner/measure/launcher.py); each
    engine's gloo store file, which vLLM leaves in /tmp, is removed with it (its IPC sockets
    went to a folder of its own, removed too: tests/integration/test_launcher.py)."""
    from tuner.measure.engine import FORKED

    for result, out in (ngram_run, baseline_run):
        assert result.engine.details["start"] == FORKED
        log = (out / "engine.log").read_text()
        stores = __import__("re").findall(r"distributed_init_method=file://(\S+)", log)
        assert stores and not any(os.path.exists(p) for p in stores)


def test_rejected_config_reports_vllms_own_reason(engine_spec, tmp_path):
    # vLLM's own SpeculativeConfig refuses it before any engine starts (tuner.checks), in the
    # words the engine would have died with.
    bad = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5,
           "prompt_lookup_max": 2}
    wl = WorkloadSpec(name="instructcoder", num_prompts=1, output_len=8)
    with pytest.raises(ConfigError) as e:
        api.bench(BenchOptions(workload=wl,
                               config=TrialConfig(speculative_config=bad),
                               settings=MeasureSettings(), out_dir=tmp_path / "b"), engine=engine_spec,
                  say=lambda _m: None)
    assert "prompt_lookup_min=5 must be <= prompt_lookup_max=2" in str(e.value)
    assert not (tmp_path / "b").exists()  # no engine launched, nothing written


def test_bench_cli_prints_a_table(engine_spec, tmp_path):
    """The README's main path end to end through the console script's module."""
    r = subprocess.run(
        [sys.executable, "-m", "tuner", "bench", "--workload", "instructcoder", "--num-prompts",
         "2", "--output-len", "32", "--concurrency", "1", "--speculative-config",
         json.dumps(NGRAM), "--output-dir", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "out tok/s" in r.stdout and "ngram k=5 window 2-5" in r.stdout
    assert (tmp_path / "b" / "result.json").exists()


def test_recommended_json_verbatim_starts_a_real_server(engine_spec, tmp_path):
    """recommendation.json's --speculative-config, passed verbatim to vLLM, is accepted."""
    from study_fakes import realistic_study

    from tuner.measure.engine import Engine

    study = realistic_study(with_failures=False)
    api.write_report(study, tmp_path / "study")
    rec = json.loads((tmp_path / "study" / "recommendation.json").read_text())
    specs = [lv["speculative_config"] for lv in rec["levels"] if lv["speculative_config"]]
    assert specs, rec["levels"]
    # The serve command carries the same JSON, verbatim.
    assert json.dumps(specs[0], sort_keys=True, separators=(",", ":")) in \
        next(lv["serve_command"] for lv in rec["levels"] if lv["speculative_config"])
    with Engine(engine_spec, TrialConfig(speculative_config=specs[0]),
                log_path=tmp_path / "engine.log") as eng:
        assert eng.alive()
    assert "SpeculativeConfig" in (tmp_path / "engine.log").read_text() or \
        specs[0]["method"] in (tmp_path / "engine.log").read_text()


def test_per_batch_size_schedule_is_honoured_by_the_real_engine(engine_spec, tmp_path):
    """Our emitted schedule format, once against the real engine: K=5 at batch 1, off above."""
    from tuner.analysis import schedule as rules
    from tuner.measure import trial as runner
    from tuner.measure import workloads
    from tuner.records.policy import LevelSpeedup

    per_k = {5: {1: LevelSpeedup(speedup=2.0, noise=0.03),
                 2: LevelSpeedup(speedup=0.9, noise=0.03)}}
    schedule = rules.bands(rules.choose_k(per_k), per_k, max_batch=256)
    spec = rules.policy_config(TrialConfig(speculative_config=NGRAM), schedule).speculative_config
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 256, 0]]
    settings = MeasureSettings(concurrencies=(1, 4), num_requests=8)
    wl = workloads.load(WorkloadSpec(name="instructcoder", num_prompts=4, output_len=48),
                        tokenizer=engine_spec.model, pool=settings.pool_size(4))
    result = runner.measure(engine_spec, TrialConfig(speculative_config=spec), wl, settings,
                            trial_dir=tmp_path)
    c1, c4 = result.levels
    assert c1.spec_decode_num_drafts > 20
    # From 2 in flight the table says K=0; drafts only while the last request drains alone.
    assert c4.spec_decode_num_drafts < 0.25 * c1.spec_decode_num_drafts

"""`tuner optimize` end to end on the fake engine (fast): baseline first, start points,
failures as data, duplicates answered from storage, resume after a killed driver, and Ray
fan-out over logical GPUs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from conftest import fake_engine_spec

from tuner import api
from tuner.errors import ConfigError
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.search import study as st

WL = WorkloadSpec(name="instructcoder", num_prompts=3, output_len=16)


def _spec(**script):
    return fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), **{"ttft_ms": 5, "tpot_ms": 1,
                                                                    **script})


def _optimize(tmp_path, *, space="ngram", n_trials=5, **kw):
    engine = kw.pop("engine", None) or _spec()
    return api.optimize(OptimizeOptions(
        strategy="optuna",  # the Optuna search under test
        workload=WL, space_name=space,
        settings=MeasureSettings(concurrencies=(1, 2)), out_dir=tmp_path / "study",
        study_name="s", n_trials=n_trials, objectives=["output_throughput", "mean_tpot_ms"],
        target_concurrency=1, constraints={"max_tpot_ms": None, "max_ttft_ms": None},
        **kw), engine=engine, say=lambda _m: None)


def test_baseline_first_then_start_points_and_every_level_stored(tmp_path):
    study = _optimize(tmp_path, n_trials=5)
    trials = sorted(study.trials, key=lambda t: t.number)
    # The baseline is an enqueued override, never a sampled point: no Optuna params.
    assert trials[0].params == {} and trials[0].user_attrs["config"]["speculative_config"] is None
    assert trials[0].user_attrs["role"] == "baseline"
    assert trials[1].user_attrs["label"] == "ngram k=5 window 2-5"
    assert st.counted_trials(study) == 5
    for t in trials:
        if t.state == optuna.trial.TrialState.COMPLETE:
            levels = t.user_attrs["result"]["levels"]
            assert [lv["concurrency"] for lv in levels] == [1, 2]
            assert t.values[0] == levels[0]["output_throughput"]


def test_a_space_vllm_refuses_is_refused_before_any_launch(tmp_path):
    # min 5 > max 2: vLLM's own SpeculativeConfig refuses every point, so no engine starts.
    bad = tmp_path / "bad.yaml"
    bad.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 1, high: 3}\n"
                   "    prompt_lookup_min: 5\n    prompt_lookup_max: 2\n")
    with pytest.raises(ConfigError, match="prompt_lookup_min=5 must be <= prompt_lookup_max=2"):
        _optimize(tmp_path, space=str(bad), n_trials=3)
    assert not (tmp_path / "study" / "trials").exists()


def test_rejected_config_is_a_fail_trial_and_the_study_goes_on(tmp_path):
    # A config the engine refuses at start-up past what vLLM's config checks can see (the
    # fake refuses every ngram config): recorded as a FAIL trial with the engine's reason.
    study = _optimize(tmp_path, space="ngram", n_trials=3,
                      engine=_spec(crash_for_spec={"method": "ngram"}))
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert done and done[0].user_attrs["role"] == "baseline"
    assert failed, "the rejected configs are recorded"
    f = failed[0].user_attrs["failure"]
    assert f["kind"] == "engine_crashed"
    assert "fake rejection of {'method': 'ngram'}" in f["reason"]
    assert "fake rejection" in f["log_tail"]


def test_grid_space_duplicates_are_answered_from_storage(tmp_path):
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 2, high: 3}\n"
                    "    prompt_lookup_max: 3\n    prompt_lookup_min: 1\n")
    study = _optimize(tmp_path, space=str(tiny), n_trials=3, sampler="random")
    study = _optimize(tmp_path, space=str(tiny), n_trials=6, sampler="random")
    launched = [t for t in study.trials if "duplicate_of" not in t.user_attrs]
    keys = [t.user_attrs["key"] for t in launched if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(keys) == len(set(keys)) == 3  # baseline, k=2, k=3: each engine launched once
    assert any("duplicate_of" in t.user_attrs for t in study.trials)


def _driver_cmd(out: Path, n_trials: int) -> list[str]:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 40, "startup_s": 0})
    return [sys.executable, "-m", "tuner", "optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER),
            "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
            f"--engine-args=--fake-script '{script}'", "--space", "ngram",
            "--n-trials", str(n_trials), "--num-prompts", "2", "--output-len", "24",
            "--concurrency", "1", "--output-dir", str(out), "--no-report"]


def test_killed_driver_resumes_with_completed_trials_intact(tmp_path):
    out = tmp_path / "study"
    proc = subprocess.Popen(_driver_cmd(out, 4), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    # Kill the driver with SIGKILL once the first trial has finished and the second runs.
    deadline = time.time() + 120
    lines = []
    while time.time() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if line.startswith("[1/"):
            time.sleep(1.5)
            break
    # The driver's own engines (not a name match: other checkouts on this host run theirs).
    engines = [p for p in psutil.Process(proc.pid).children(recursive=True)
               if "tuner.testing.fake_engine" in " ".join(p.cmdline())]
    assert engines, "".join(lines)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # PR_SET_PDEATHSIG: the engine the dead driver started is gone too.
    _, alive = psutil.wait_procs(engines, timeout=10)
    assert not alive
    before = st.open_existing(out)
    done_before = {t.number: t.values for t in before.trials
                   if t.state == optuna.trial.TrialState.COMPLETE}
    assert done_before, "".join(lines)
    r = subprocess.run(_driver_cmd(out, 4), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Resuming" in r.stderr
    after = st.open_existing(out)
    for number, values in done_before.items():
        assert after.trials[number].values == values  # nothing measured is lost
    died = [t for t in after.trials if t.user_attrs.get("failure", {}).get("kind") == "driver_died"]
    assert len(died) == 1
    retried = [t for t in after.trials if t.params == died[0].params
               and t.state == optuna.trial.TrialState.COMPLETE]
    assert retried, "the interrupted config is measured again"
    assert st.counted_trials(after) == 4


def test_ray_logical_gpus_run_two_trials_at_once_each_on_its_own_gpu(tmp_path):
    pytest.importorskip("ray")
    import ray

    try:
        study = api.optimize(OptimizeOptions(
            strategy="optuna",  # the Optuna search under test
            workload=WL, space_name="ngram",
            settings=MeasureSettings(concurrencies=(1,)), out_dir=tmp_path / "study",
            study_name="ray", n_trials=5, objectives=["output_throughput"],
            target_concurrency=1, constraints={}, logical_gpus=2, gpus_per_trial=1), engine=_spec(tpot_ms=30),
            say=lambda _m: None)
    finally:
        ray.shutdown()
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE
            and "duplicate_of" not in t.user_attrs]
    assert len(done) == 5
    gpus = [t.user_attrs.get("cuda_visible_devices") for t in done]
    assert all(g in ("0", "1") for g in gpus), gpus
    # Overlap in time proves parallelism; never more than 2 engines at once.
    spans = sorted((t.user_attrs["ran_from"], t.user_attrs["ran_to"],
                    t.user_attrs["cuda_visible_devices"]) for t in done)
    events = sorted([(s, 1, g) for s, _, g in spans] + [(e, -1, g) for _, e, g in spans])
    active: list[str] = []
    peak = 0
    for _, kind, gpu in events:
        if kind == 1:
            assert gpu not in active, "two concurrent trials never share a GPU"
            active.append(gpu)
        else:
            active.remove(gpu)
        peak = max(peak, len(active))
    assert peak == 2, "two trials ran at once, never more"

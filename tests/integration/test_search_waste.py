"""No launch is wasted on what the study already knows (fake engine): a config the engine
refused is launched once however often it is proposed, a study where every trial failed exits
1 with the most common reason, samplers never propose the baseline, trials.csv lists each
config once per level, and a study stored before these rules resumes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import optuna
import pandas as pd
import pytest
from conftest import fake_engine_spec

from tuner import api, cli
from tuner.api import write_report as write_outputs
from tuner.measure import workloads
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.records.results import BenchResult
from tuner.search import outcomes
from tuner.search import study as st

WL = WorkloadSpec(name="instructcoder", num_prompts=2, output_len=8)
OLD_STUDY = Path(__file__).resolve().parent.parent / "data" / "old_study_grid"
COMPLETE, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL


def _optimize(out: Path, *, space: str, n_trials: int, sampler: str = "tpe", **kw):
    say = kw.pop("say", lambda _m: None)
    engine = kw.pop("engine", None) or fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER),
                                                        ttft_ms=5, tpot_ms=1)
    return api.optimize(OptimizeOptions(
        strategy="optuna",  # the Optuna search under test
        workload=kw.pop("workload", WL),
        space_name=space, settings=kw.pop("settings", MeasureSettings(concurrencies=(1, 2))),
        out_dir=out, study_name=kw.pop("study_name", "s"), n_trials=n_trials, sampler=sampler,
        objectives=kw.pop("objectives", ["output_throughput", "mean_tpot_ms"]),
        target_concurrency=kw.pop("target_concurrency", 1),
        constraints={"max_tpot_ms": None, "max_ttft_ms": None}, **kw), engine=engine, say=say)


def _launched(out: Path) -> list[int]:
    """Trials that started an engine: each has its own engine.log."""
    return sorted(int(p.parent.name) for p in (out / "trials").glob("*/engine.log"))


def test_a_rejected_config_proposed_again_is_launched_once(tmp_path):
    # The fake engine refuses every ngram config at start-up (past what vLLM's config checks
    # see before a launch); k=2 is proposed twice on purpose (two identical start points),
    # then the sampler goes on.
    space = tmp_path / "refused.yaml"
    space.write_text("methods:\n  ngram:\n    num_speculative_tokens: {type: int, low: 2, high: 3}\n"
                     "start_points:\n  - {method: ngram, num_speculative_tokens: 2}\n"
                     "  - {method: ngram, num_speculative_tokens: 2}\n")
    refusing = fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5, tpot_ms=1,
                                crash_for_spec={"method": "ngram"})
    lines: list[str] = []
    out = tmp_path / "study"
    study = _optimize(out, space=str(space), n_trials=3, say=lines.append, engine=refusing)
    trials = study.get_trials(deepcopy=False)
    copies = [t for t in trials if "duplicate_of" in t.user_attrs]
    assert copies, "the second proposal of k=2 is answered from storage"
    for copy in copies:
        original = trials[copy.user_attrs["duplicate_of"]]
        assert copy.state == FAIL and original.state == FAIL
        assert copy.user_attrs["key"] == original.user_attrs["key"]
        assert copy.user_attrs["failure"]["kind"] == "engine_crashed"
        assert copy.user_attrs["failure"]["reason"] == original.user_attrs["failure"]["reason"]
        assert "fake rejection" in copy.user_attrs["failure"]["reason"]
        assert copy.number not in _launched(out)
    launched_keys = [trials[n].user_attrs["key"] for n in _launched(out)]
    assert len(launched_keys) == len(set(launched_keys)) == 3  # baseline, k=2, k=3: once each
    assert st.counted_trials(study) == 3  # the copies are no launch and count for nothing
    assert any("answered from storage as FAIL (no engine launched" in ln for ln in lines)
    # The same command again: nothing new to launch, nothing launched.
    again = _optimize(out, space=str(space), n_trials=5, engine=refusing)
    assert len(_launched(out)) == 3 and st.counted_trials(again) == 3


def test_every_trial_failed_exits_1_naming_the_most_common_failure(tmp_path, capsys):
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 1, "startup_s": 0,
                         "crash_on_start": "ValueError: the GPU is not there"})
    out = tmp_path / "study"
    rc = cli.main(["optimize", "--strategy", "optuna", "--model", str(EMBEDDED_TOKENIZER),
                   "--vllm-cmd", f"{sys.executable} -m tuner.testing.fake_engine",
                   f"--engine-args=--fake-script '{script}'", "--space", "ngram",
                   "--n-trials", "3", "--num-prompts", "2", "--output-len", "8",
                   "--concurrency", "1", "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert rc == 1, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("tuner: error: All 3 trials failed; most common: engine_crashed x3: "
                           "vLLM exited with status 1"), last
    assert "ValueError: the GPU is not there" in last
    log = last.split("Logs: ", 1)[1].split()[0]
    assert Path(log).is_file() and Path(log).parent.parent == out / "trials"
    assert "Traceback" not in err
    # Nothing ever started, so the setup is suspect, not the configs: all were launched.
    assert len(_launched(out)) == 3
    assert (out / "report.html").exists() and (out / "trials.csv").exists()


@pytest.mark.parametrize("sampler", ["random", "grid"])
def test_samplers_never_propose_the_baseline(tmp_path, sampler):
    study = _optimize(tmp_path / "study", space="ngram_small", n_trials=9, sampler=sampler)
    trials = study.get_trials(deepcopy=False)
    baselines = [t for t in trials if st.is_baseline(t)]
    assert [t.number for t in baselines] == [0] and baselines[0].params == {}
    for t in trials[1:]:
        assert t.distributions["method"].choices == ("ngram",)
    if sampler == "grid":  # every grid point once, then the search stops: nothing left
        assert not any("duplicate_of" in t.user_attrs for t in trials)
        assert len(trials) == 9 and len({t.user_attrs["key"] for t in trials}) == 9


def test_trials_csv_lists_each_config_once_per_level(tmp_path):
    out = tmp_path / "study"
    # Grid with --n-trials below its size leaves grid points WAITING: the repeats must still
    # re-measure their own config, not take one of those.
    study = _optimize(out, space="ngram_small", n_trials=4, sampler="grid", repeats=2)
    trials = study.get_trials(deepcopy=False)
    repeats = [t for t in trials if t.user_attrs.get("role") == "repeat"]
    assert len(repeats) == 4  # the baseline and the three leaders
    for t in repeats:
        assert t.state == COMPLETE
        assert t.user_attrs["key"] == trials[t.user_attrs["repeat_of"]].user_attrs["key"]
    # A proposal answered from storage, as the sampler makes when it re-proposes a config.
    dup = study.ask()
    first = trials[1]
    outcomes.label_trial(dup, TrialConfig.model_validate(first.user_attrs["config"]), "search")
    outcomes.tell_result(study, dup, BenchResult.model_validate(first.user_attrs["result"]),
                   objectives=["output_throughput", "mean_tpot_ms"], concurrency=1,
                   constraints={}, duplicate_of=first.number)
    paths = write_outputs(study, out)
    df = pd.read_csv(paths["trials_csv"])
    assert not df.duplicated(["config_key", "concurrency"]).any()
    done = df[df["state"] == "COMPLETE"]
    assert len(done) == 4 * 2  # baseline + 3 grid configs, at c=1 and c=2
    waiting = df[df["state"] == "WAITING"]  # the grid points left, each its own config
    assert len(waiting) == waiting["config_key"].nunique() == 4
    pooled = df[df["n_measurements"] == 2]
    assert len(pooled) == 4 * 2 and set(pooled["n_repeats"]) == {1}
    for _, row in pooled.iterrows():
        runs = [t for t in trials if t.user_attrs.get("key") == row["config_key"]
                and t.state == COMPLETE]
        values = sorted(lv["output_throughput"] for t in runs
                        for lv in t.user_attrs["result"]["levels"]
                        if lv["concurrency"] == row["concurrency"])
        assert row["output_throughput"] == pytest.approx(sum(values) / 2)  # median of two
        assert len(json.loads(row["trials"])) == 2
    assert "duplicate_of" not in df.columns
    raw = pd.read_csv(paths["trials_raw_csv"])
    assert sorted(raw["trial"].unique()) == [t.number for t in study.get_trials()]
    page = paths["report_html"].read_text()
    assert f"<tr class=''><td>{dup.number}</td>" not in page
    assert "1 proposal(s) of a config already measured or refused answered from storage" in page


def test_a_study_stored_with_the_baseline_as_a_sampled_choice_resumes(tmp_path):
    # tests/data/old_study_grid: `tuner optimize --space ngram_small --sampler grid
    # --n-trials 3 --concurrency 1,2 --num-prompts 2 --output-len 8` run with the code before
    # the baseline left the sampled space: "method" is stored as a categorical over
    # (none, ngram), trial 1 is the baseline proposed again, six grid points are WAITING.
    out = tmp_path / "study"
    out.mkdir()
    shutil.copy(OLD_STUDY / "study.journal", out / "study.journal")
    old = st.open_existing(out)
    meta = st.settings_of(old)
    before = {t.number: t.values for t in old.get_trials() if t.state == COMPLETE}
    assert old.trials[0].distributions["method"].choices == ("none", "ngram")
    workload, settings = meta.workload, meta.settings
    digest = workloads.load(workload, tokenizer=str(EMBEDDED_TOKENIZER),
                            pool=settings.pool_size(workload.num_prompts)).digest
    if digest != meta.workload_digest:
        # How prompts are loaded may change; this test is about Optuna's distributions.
        st.store_settings(old, meta.model_copy(update={"workload_digest": digest}))
    study = _optimize(out, space="ngram_small", n_trials=12, workload=workload,
                      settings=settings,
                      study_name=old.study_name, objectives=list(meta.objectives),
                      target_concurrency=meta.target_concurrency)
    trials = study.get_trials(deepcopy=False)
    for number, values in before.items():
        assert trials[number].values == values
    measured = [t for t in trials if t.state == COMPLETE and "duplicate_of" not in t.user_attrs]
    keys = [t.user_attrs["key"] for t in measured]
    assert len(keys) == len(set(keys)) == 9  # baseline + the 8 configs of ngram_small, once
    assert all(t.distributions["method"].choices == ("none", "ngram")
               for t in trials if "method" in t.distributions)
    paths = write_outputs(study, out)
    df = pd.read_csv(paths["trials_csv"])
    assert len(df) == 9 * 2 and not df.duplicated(["config_key", "concurrency"]).any()

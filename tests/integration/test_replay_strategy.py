"""`tuner optimize --strategy replay` end to end on the fake engine: baseline with tokens,
the space replayed, one calibration launch, leaders confirmed and repeated interleaved with
the baseline, every launch an ordinary trial, predicted.csv written; `tuner predict` after."""

from __future__ import annotations

import json
import sys

import optuna
import pandas as pd
import pytest
from conftest import fake_engine_spec

from tuner import api, cli
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.outputs import decisions
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.search import candidates
from tuner.search import study as st

pytestmark = pytest.mark.vllm  # steps vLLM's proposers: fails where vLLM is missing

WL = WorkloadSpec(name="instructcoder", num_prompts=3, output_len=24)


def _optimize(tmp_path, *, n_trials: int, strategy: str = "replay", space: str = "ngram",
              say=None, detail=None, sample_prompts: int = 0):
    """The study on the fake engine; without a workload sample unless asked (the confirm
    launches these tests check; test_the_workload_sample_* check the sample's path)."""
    lines: list[str] = []
    study = api.optimize(OptimizeOptions(
        workload=WL,
        space_name=space, settings=MeasureSettings(concurrencies=(1, 2),
                                                   sample_prompts=sample_prompts),
        out_dir=tmp_path / "study", study_name="s", n_trials=n_trials,
        objectives=["output_throughput", "mean_tpot_ms"], target_concurrency=1,
        constraints={"max_tpot_ms": None, "max_ttft_ms": None}, strategy=strategy), engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5,
                                             tpot_ms=2),
        say=say or lines.append, detail=detail)
    return study, lines


def test_replay_launches_baseline_calibration_then_confirms(tmp_path):
    detail: list[str] = []
    study, lines = _optimize(tmp_path, n_trials=6, detail=detail.append)
    trials = sorted(study.trials, key=lambda t: t.number)
    roles = [t.user_attrs["role"] for t in trials]
    assert roles[:2] == ["baseline", "calibration"]
    assert len(trials) <= 6, "--n-trials is the launch budget, repeats included"
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    assert set(roles[2:]) <= {"confirm", "repeat"} and "confirm" in roles
    # interleaved with the baseline: a baseline repeat comes before any leader's repeat
    repeats = [t for t in trials if t.user_attrs["role"] == "repeat"]
    assert repeats and repeats[0].user_attrs["repeat_of"] == trials[0].number
    assert any(line.startswith("Replaying 160 configs") for line in lines)
    assert any(line.startswith("Replayed 160 configs") for line in detail)  # -v
    assert any("Predicted leaders at c=1" in line for line in lines)
    pred = pd.read_csv(tmp_path / "study" / "predicted.csv")
    assert set(pred["concurrency"]) == {1, 2}
    ngram = pred[pred["method"] == "ngram"]
    assert len(ngram) == 2 * len(ngram["key"].unique()) > 2 * 100  # the whole 160-point grid
    confirmed = ngram[ngram["measured_trials"] > 0]
    assert len(confirmed) >= 2 and confirmed["err_acceptance_length_pct"].notna().all()
    # every launch has its tokens stored with it
    captures = [st.token_capture(tmp_path / "study", t) for t in trials]
    assert all(cap is not None for cap in captures)
    # Every launch at a level sent the same requests in the same order, and no launch sent
    # one prompt twice (the study's request schedule, stored with it).
    for c in (1, 2):
        sent = {tuple(tuple(r.prompt.tolist()) for r in sorted(cap.level(c, warmup=False),
                                                                key=lambda r: r.index))
                for cap in captures}
        assert len(sent) == 1, f"c={c}: {len(sent)} different request sequences"
    for cap in captures:
        prompts = [tuple(r.prompt.tolist()) for r in cap.requests]
        assert len(prompts) == len(set(prompts))
    schedule = st.schedule_of(study)
    assert schedule is not None and schedule.requests == len(captures[0].requests)


def test_the_confirm_loop_resumes_and_predict_reads_the_study(tmp_path, capsys):
    _optimize(tmp_path, n_trials=3)
    study, lines = _optimize(tmp_path, n_trials=4)
    numbers = [t.user_attrs["role"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert numbers.count("baseline") == 1 and numbers.count("calibration") == 1
    assert len(study.trials) == 4
    # The decision rule is kept with the study's settings, so `tuner report` renders the same.
    stored = st.settings_of(study)
    assert (stored.confidence, stored.margin) == (0.95, 0.02)
    rc = cli.main(["predict", str(tmp_path / "study"), "--top", "3", "--json"])
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert {r["concurrency"] for r in doc["rows"]} == {1, 2}
    assert doc["step_cost"]
    rc = cli.main(["predict", str(tmp_path / "study"), "--levels", "8"])
    assert rc == 2
    assert "captured at 1,2" in capsys.readouterr().err


def test_on_resume_the_done_count_is_what_n_trials_counts_engine_launches(tmp_path):
    # Under replay --n-trials is the launch budget, repeats included (the H200 study printed
    # "5 of 14 trials already done" after 9 launches).
    first, _ = _optimize(tmp_path, n_trials=5)
    launched = [t for t in first.trials if t.state in (optuna.trial.TrialState.COMPLETE,
                                                       optuna.trial.TrialState.FAIL)]
    assert any(t.user_attrs["role"] == "repeat" for t in launched)  # else both counts agree
    _, lines = _optimize(tmp_path, n_trials=6)
    assert f"Resuming study 's': {len(launched)} of 6 engine launches already done." in lines


def test_a_space_replay_cannot_predict_is_refused_and_auto_falls_back(tmp_path):
    with pytest.raises(Exception, match="cannot be replayed"):
        _optimize(tmp_path, n_trials=2, space="draft")
    study, lines = _optimize(tmp_path / "auto", n_trials=2, strategy="auto")
    roles = [t.user_attrs["role"] for t in study.trials]
    assert roles[:2] == ["baseline", "calibration"]  # ngram: auto replays


def test_an_aligned_baseline_is_launched_and_anchors_the_step_cost(tmp_path):
    from tuner.records.options import AlignedBaselineFlags

    aligned = AlignedBaselineFlags(env=("FAKE_PATH=speculative",))  # --aligned-baseline-env
    lines: list[str] = []
    study = api.optimize(OptimizeOptions(
        workload=WL,
        space_name="ngram", settings=MeasureSettings(concurrencies=(1,), sample_prompts=0),
        out_dir=tmp_path / "study", study_name="s", n_trials=3,
        objectives=["output_throughput"], target_concurrency=1, constraints={},
        strategy="replay", aligned_baseline=aligned), engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5,
                                             tpot_ms=2), say=lines.append)
    roles = [t.user_attrs["role"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert roles == ["baseline", "aligned_baseline", "calibration"]
    pred = pd.read_csv(tmp_path / "study" / "predicted.csv")
    assert pred["path"].dropna().str.contains("aligned baseline").all()


def test_a_leader_that_fails_leaves_the_confirmation_and_the_budget_goes_on(tmp_path):
    # The replay is deterministic over the fake engine's tokens: a first study names the
    # first leader it confirms; a second study, whose engine rejects exactly that config,
    # records it as one FAIL, never relaunches it, and spends the rest on the others.
    first, _ = _optimize(tmp_path / "first", n_trials=3)
    leader = next(t for t in first.trials if t.user_attrs["role"] == "confirm")
    spec = leader.user_attrs["config_override"]["speculative_config"]
    lines: list[str] = []
    study = api.optimize(OptimizeOptions(
        workload=WL,
        space_name="ngram", settings=MeasureSettings(concurrencies=(1, 2), sample_prompts=0),
        out_dir=tmp_path / "second" / "study", study_name="s", n_trials=6,
        objectives=["output_throughput", "mean_tpot_ms"], target_concurrency=1,
        constraints={"max_tpot_ms": None, "max_ttft_ms": None}, strategy="replay"), engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5,
                                             tpot_ms=2, crash_for_spec=spec),
        say=lines.append)
    failed = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    assert len(failed) == 1
    assert failed[0].user_attrs["config_override"]["speculative_config"] == spec
    assert any("failed; it leaves the confirmation" in line for line in lines)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 5, "the budget went to the other leaders and repeats"
    assert {t.user_attrs["role"] for t in done} >= {"confirm"}


def _auto(tmp_path, *, n_trials: int, differs: bool, lines: list[str],
          cudagraph_mode: str | None = None, detail: list[str] | None = None):
    return api.optimize(OptimizeOptions(
        workload=WL,
        space_name="ngram", settings=MeasureSettings(concurrencies=(1,), sample_prompts=0),
        out_dir=tmp_path / "study", study_name="s", n_trials=n_trials,
        objectives=["output_throughput"], target_concurrency=1, constraints={},
        strategy="replay"), engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER), ttft_ms=5,
                                             tpot_ms=2, speculative_path_differs=differs,
                                             cudagraph_mode=cudagraph_mode), say=lines.append, detail=None if detail is None else detail.append)


def test_auto_alignment_follows_the_engine_path_the_speculative_trial_took(tmp_path):
    # The fake engine logs vLLM 0.26's GPU n-gram path: V1 runner, no async scheduling.
    lines: list[str] = []
    study = _auto(tmp_path, n_trials=9, differs=True, lines=lines)
    trials = sorted(study.trials, key=lambda t: t.number)
    roles = [t.user_attrs["role"] for t in trials]
    assert roles[:3] == ["baseline", "calibration", "aligned_baseline"]
    aligned = trials[2].user_attrs["result"]
    assert aligned["config"]["engine_args"] == {"no_async_scheduling": True}
    assert aligned["config"]["engine_env"] == {"VLLM_USE_V2_MODEL_RUNNER": "0"}
    path = {k: aligned["engine"]["details"].get(k) for k in ("model_runner", "async_scheduling")}
    assert path == {"model_runner": "V1", "async_scheduling": "false"}
    assert trials[1].user_attrs["result"]["engine"]["details"]["model_runner"] == "V1"
    assert trials[0].user_attrs["result"]["engine"]["details"]["model_runner"] == "V2"
    # Repeated beside the plain baseline, so the path's cost has a spread as well.
    repeated = [roles[t.user_attrs["repeat_of"]] for t in trials if "repeat_of" in t.user_attrs]
    assert "aligned_baseline" in repeated and "baseline" in repeated
    # The split is in the full verdict: with -v, and in the report's "How it was decided".
    ranking = [e.text for e in decisions.load_decisions(tmp_path / "study")
               if e.topic == "confirmation"]
    assert any("engine path" in t and "speculation alone" in t for t in ranking), ranking
    short = [ln for ln in lines if ln.startswith("Ranking")]
    assert len(short) == 1 and "speculation alone" not in short[0]
    pred = pd.read_csv(tmp_path / "study" / "predicted.csv")
    spec = pred[pred["method"] == "ngram"]
    assert spec["path"].str.contains("aligned baseline").all()
    priced = spec[spec["pred_speedup"].notna()]
    assert len(priced) > 100
    assert (priced["path_cost"] * priced["pred_speculation_gain"]
            - priced["pred_speedup"]).abs().max() < 1e-9
    # A resumed study keeps its one aligned baseline.
    study = _auto(tmp_path, n_trials=10, differs=True, lines=[])
    assert [t.user_attrs["role"] for t in study.trials].count("aligned_baseline") == 1


def test_split_cuda_graphs_get_a_second_calibration_that_drafts_rarely(tmp_path):
    # vLLM 0.26 on the GPU: FULL_AND_PIECEWISE, so a step where a request drafted fewer than
    # K tokens leaves the full graph; the step cost needs a point where most steps do.
    lines: list[str] = []
    detail: list[str] = []
    study = _auto(tmp_path, n_trials=5, differs=True, lines=lines,
                  cudagraph_mode="FULL_AND_PIECEWISE", detail=detail)
    trials = sorted(study.trials, key=lambda t: t.number)
    roles = [t.user_attrs["role"] for t in trials]
    assert roles[:4] == ["baseline", "calibration", "aligned_baseline", "calibration"]
    first, second = (trials[i].user_attrs["config_override"]["speculative_config"]
                     for i in (1, 3))
    assert first != second
    assert sum(ln.startswith("Second calibration launch") for ln in lines) == 1
    assert sum(ln.startswith("Second calibration launch") and "drafts a full K" in ln
               for ln in detail) == 1  # why, with -v
    assert any("non-uniform share" in ln for ln in detail if "step cost" in ln)
    pred = pd.read_csv(tmp_path / "study" / "predicted.csv")
    rows = pred[pred["speculative_config"].fillna("").str.contains('"prompt_lookup_min"')]
    uniform = {json.dumps(json.loads(s), sort_keys=True): u
               for s, u in zip(rows["speculative_config"], rows["uniform_share"], strict=True)}
    assert uniform[json.dumps(second, sort_keys=True)] <= min(uniform.values()) + 1e-12
    # Resumed, it calibrates no more.
    study = _auto(tmp_path, n_trials=6, differs=True, lines=[],
                  cudagraph_mode="FULL_AND_PIECEWISE")
    assert [t.user_attrs["role"] for t in study.trials].count("calibration") == 2


def test_auto_alignment_adds_no_launch_where_the_path_is_the_same(tmp_path):
    # The CPU build: n-gram keeps the baseline's path, so nothing is aligned.
    lines: list[str] = []
    study = _auto(tmp_path, n_trials=3, differs=False, lines=[], detail=lines)
    roles = [t.user_attrs["role"] for t in sorted(study.trials, key=lambda t: t.number)]
    assert roles[:2] == ["baseline", "calibration"] and "aligned_baseline" not in roles
    assert sum("no aligned baseline to measure" in ln for ln in lines) == 1


def test_the_suffix_sample_is_climbed_around_the_predicted_leaders(tmp_path):
    pytest.importorskip("arctic_inference")
    detail: list[str] = []
    _, lines = _optimize(tmp_path, n_trials=3, space="suffix", detail=detail.append)
    climbed = [line for line in detail if line.startswith("Searched the sampled grids")]
    assert len(climbed) == 1
    assert not any(line.startswith("Searched the sampled grids") for line in lines)  # -v only
    assert [e.text for e in decisions.load_decisions(tmp_path / "study")
            if e.topic == "climb"] == climbed
    pred = pd.read_csv(tmp_path / "study" / "predicted.csv")
    keys = pred[pred["method"] == "suffix"]["key"].unique()
    assert len(keys) > candidates.SUFFIX_POINTS + 1  # the sample, its start point, the climb
    assert len(keys) <= candidates.SUFFIX_POINTS + 1 + candidates.REFINE_MAX


def _cli_optimize(out, *flags: str) -> None:
    script = json.dumps({"ttft_ms": 5, "tpot_ms": 2, "startup_s": 0})
    rc = cli.main([*flags, "optimize", "--strategy", "replay", "--model",
                   str(EMBEDDED_TOKENIZER), "--vllm-cmd",
                   f"{sys.executable} -m tuner.testing.fake_engine",
                   f"--engine-args=--fake-script '{script}'", "--space", "ngram",
                   "--n-trials", "3", "--num-prompts", "3", "--output-len", "24",
                   "--concurrency", "1,2", "--sample-prompts", "0", "--output-dir", str(out)])
    assert rc == 0


WORKING = ("step cost c=", "Replayed 160 configs", "engine starting", "engine ready",
           "no aligned baseline to measure")


def test_without_v_optimize_prints_a_line_per_trial_and_the_decisions_only(tmp_path, capsys):
    out = tmp_path / "study"
    _cli_optimize(out)
    printed = capsys.readouterr()
    lines = printed.err.splitlines()
    assert [ln.split(" ", 1)[0] for ln in lines if ln.startswith("[")] == [
        "[1/3]", "[2/3]", "[3/3]"]
    assert not [ln for ln in lines if any(w in ln for w in WORKING)], printed.err
    assert any(ln.startswith("Calibration launch: ") for ln in lines)
    assert any(ln.startswith("Predicted leaders at c=1: ") for ln in lines)
    assert "--n-trials 3: every engine launch of the budget is spent." in lines
    assert printed.out.startswith("Concurrency 1: ")  # then the recommendation
    # The working is in the report instead, and `tuner report` renders it from the folder.
    for name in ("report.md", "report.html"):
        (out / name).unlink()
    assert cli.main(["report", str(out)]) == 0
    md, page = (out / "report.md").read_text(), (out / "report.html").read_text()
    section = md.split("## How it was decided", 1)[1].split("\n## ", 1)[0]
    for fact in ("**Replay of the space:** Replayed 160 configs of space 'ngram'",
                 "**Calibration launches:** ngram k=", "**Engine path:** Trial 1 (ngram k=",
                 "  - c=1: step = ", "  - c=2: step = ",
                 "**Predicted leaders:** At c=1, launched to confirm them: ngram k=",
                 "**Why the search stopped:** --n-trials 3: every engine launch"):
        assert fact in section, section
    assert "<h2>How it was decided</h2>" in page and "c=2: step = " in page
    assert md.index("## How it was decided") < md.index("## Predicted by replay")


def test_with_v_optimize_also_prints_the_searchs_working(tmp_path, capsys):
    _cli_optimize(tmp_path / "study", "-v")
    lines = capsys.readouterr().err.splitlines()
    for w in WORKING:
        assert any(w in ln for ln in lines), (w, lines)
    assert sum(ln.startswith("  step cost c=") for ln in lines) == 2  # one per level
    assert [ln.split(" ", 1)[0] for ln in lines if ln.startswith("[")] == [
        "[1/3]", "[2/3]", "[3/3]"]


def test_the_workload_sample_decides_each_level_and_launches_confirm_its_choice(tmp_path):
    from tuner.outputs import selection as words
    from tuner.records.selection import Choice

    detail: list[str] = []
    study, lines = _optimize(tmp_path, n_trials=6, sample_prompts=24, detail=detail.append)
    trials = sorted(study.trials, key=lambda t: t.number)
    roles = [t.user_attrs["role"] for t in trials]
    assert roles[:2] == ["baseline", "calibration"] and len(trials) <= 6
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in trials)
    # Only the first baseline sent the sample; the replay read it.
    first = st.token_capture(tmp_path / "study", trials[0], sample=True)
    assert len(first.sample()) == 24
    assert all(not st.token_capture(tmp_path / "study", t, sample=True).sample()
               for t in trials[1:])
    selections = st.selections_of(study)
    assert [s.concurrency for s in selections] == [1, 2]
    launched = {t.user_attrs["key"] for t in trials}
    for sel in selections:
        assert sel.sample_prompts == 24
        assert sel.lo is None or sel.lo <= sel.speedup <= sel.hi
        assert sel.subject_config is not None and sel.subject_config.key() == sel.subject_key
        if sel.choice == Choice.ON:  # on only once launched, and above 1.00x
            assert sel.subject_key in launched and sel.lo > 1.0
    # The forecast's lines say each level once per change, and the answer rests on them.
    assert any(ln.startswith("Forecast concurrency 1: ") for ln in lines)
    recs = api.report(study_dir=tmp_path / "study")[1]
    for rec, sel in zip(recs, selections, strict=True):
        assert rec.verdict.selection == sel
        assert (rec.status == "recommend") == (sel.choice == Choice.ON)
        assert words.headline(sel).split(": ")[1].startswith(
            {Choice.ON: "Turn on", Choice.OFF: "Leave", Choice.UNDECIDED: "Undecided"}[
                sel.choice])
    kept = {e.topic for e in decisions.load_decisions(tmp_path / "study")}
    assert "selection" in kept

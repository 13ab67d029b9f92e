"""`tuner verify STUDY` end to end on the fake engine: each level's pick and the baseline
launched again, interleaved, on prompts the study never sent; verify.json and the table; the
study's journal left as it was; a failed launch recorded while the check goes on; bad input
refused with one message and exit 2. Every engine serves on one virtual clock
(tuner.testing.fake_clock) the load generator reads too, so the measured speedups are the
script's, however loaded the host is."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import fake_engine_spec

from tuner import api, cli, tokens
from tuner.measure import loadgen
from tuner.measure.workloads import EMBEDDED_TOKENIZER
from tuner.records.configs import MeasureSettings, WorkloadSpec
from tuner.records.options import OptimizeOptions
from tuner.records.storage import STUDY_ATTR
from tuner.search import study as st
from tuner.testing.fake_clock import VirtualClock
from tuner.testing.fake_engine import SCRIPT_ENV

WL = WorkloadSpec(name="instructcoder", num_prompts=3, output_len=16)
# Speculation pays on this fake engine: a step yields 1 + K * 0.6 tokens at almost no cost.
SCRIPT = {"ttft_ms": 5, "tpot_ms": 4, "verify_cost_per_token": 0.001}


@pytest.fixture(scope="module", autouse=True)
def clock(tmp_path_factory):
    """One virtual clock for the module: the made study's engines and verify's launches of
    them (its stored engine spec names this clock) are all on it."""
    clock = VirtualClock.create(tmp_path_factory.mktemp("clock") / "virtual-clock")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(loadgen, "clock", clock)
        yield clock


def _study(out, *, n_trials: int, repeats: int = 2, workload: WorkloadSpec = WL):
    return api.optimize_and_report(OptimizeOptions(
        strategy="optuna", workload=workload, space_name="ngram",
        settings=MeasureSettings(concurrencies=(1, 2)), out_dir=out, study_name="s",
        n_trials=n_trials, repeats=repeats, objectives=["output_throughput", "mean_tpot_ms"],
        target_concurrency=1, constraints={"max_tpot_ms": None, "max_ttft_ms": None}),
        engine=fake_engine_spec(tokenizer=str(EMBEDDED_TOKENIZER),
                                virtual_clock=loadgen.clock.path, **SCRIPT),
        say=lambda _m: None)


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A small study with an interval at each level, made once; each test copies it."""
    out = tmp_path_factory.mktemp("made") / "study"
    outcome = _study(out, n_trials=4)
    assert all(r.speedup_interval is not None for r in outcome.recommendations)
    return out


@pytest.fixture
def study_dir(made, tmp_path):
    return shutil.copytree(made, tmp_path / "study")


def _prompts(capture: tokens.TokenCapture) -> list[tuple[int, ...]]:
    return [tuple(r.prompt.tolist()) for r in capture.requests]


def test_verify_measures_pick_and_baseline_on_fresh_prompts_and_leaves_the_study_alone(
        study_dir, capsys):
    journal = (study_dir / "study.journal").read_bytes()
    rc = cli.main(["verify", str(study_dir), "--launches", "2"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert out.startswith("conc") and "ngram" in out
    doc = json.loads((study_dir / "verify.json").read_text())
    picks = {json.dumps(lv["target"]["subject"], sort_keys=True) for lv in doc["levels"]}
    n = 2 * (1 + len(picks))  # interleaved: the baseline, then each level's pick, twice
    assert "Verifying study 's' out of sample" in err and f"[{n}/{n}] round 2" in err
    assert [ln["role"] for ln in doc["launches"]] == (["baseline"] + ["subject"] * len(picks)) * 2
    assert all(ln["failure"] is None for ln in doc["launches"])
    assert [lv["target"]["concurrency"] for lv in doc["levels"]] == [1, 2]
    for lv in doc["levels"]:
        assert lv["outcome"] in ("inside", "above", "below")
        assert len(lv["subject_throughputs"]) == len(lv["baseline_throughputs"]) == 2
        assert lv["measured_speedup"] > 1.5  # speculation pays on this engine
        assert lv["target"]["stated_interval"] is not None
    assert len(doc["said"]) == 2
    # The study's trials stay the study's: its journal is untouched.
    assert (study_dir / "study.journal").read_bytes() == journal
    # Every launch sent the same requests, none of them a prompt the study sent.
    study = st.open_existing(study_dir)
    sent = {p for t in study.trials if (cap := st.token_capture(study_dir, t))
            for p in _prompts(cap)}
    launched = [_prompts(tokens.TokenCapture.load(study_dir / "verify" / str(i)
                                                  / tokens.FILE_NAME)) for i in range(n)]
    assert all(seq == launched[0] for seq in launched)
    assert sent and not sent & set(launched[0])
    assert len(launched[0]) == st.schedule_of(study).requests  # the study's counts
    # Its repeats feed the host's noise profile under an entry of their own, for the studies
    # that follow: per level, one degree of freedom per config launched twice.
    from tuner.search import noise_profile
    entries = noise_profile._read(noise_profile.machine_key(st.settings_of(study)))["studies"]
    mine = entries[str((study_dir / "verify").resolve())]
    assert {int(c): e["df"] for c, e in mine.items()} == {1: 1 + len(picks), 2: 1 + len(picks)}


def test_a_failed_launch_is_recorded_and_the_check_goes_on(study_dir, capsys):
    # The study's engine now rejects every n-gram config (the picks): their launches fail,
    # the baselines still run.
    study = st.open_existing(study_dir)
    stored = study.user_attrs[STUDY_ATTR]
    env = stored["engine_spec"]["env"]
    env[SCRIPT_ENV] = json.dumps({**json.loads(env[SCRIPT_ENV]),
                                  "crash_for_spec": {"method": "ngram"}})
    study.set_user_attr(STUDY_ATTR, stored)
    rc = cli.main(["verify", str(study_dir), "--launches", "1"])
    _out, err = capsys.readouterr()
    assert rc == 0
    assert "failed" in err and "the check goes on" in err
    doc = json.loads((study_dir / "verify.json").read_text())
    failed = [ln for ln in doc["launches"] if ln["failure"] is not None]
    assert failed and all(ln["role"] == "subject" for ln in failed)
    assert {lv["outcome"] for lv in doc["levels"]} == {"unmeasured"}


def test_bad_input_is_one_message_and_exit_2(tmp_path, capsys):
    assert cli.main(["verify", str(tmp_path / "nothing")]) == 2
    assert "No study in" in capsys.readouterr().err
    _study(tmp_path / "one", n_trials=1, repeats=1)  # the baseline alone: no interval
    assert cli.main(["verify", str(tmp_path / "one")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tuner: error:") and "no level has a recommendation" in err
    assert "Traceback" not in err


def test_a_random_workload_drawn_again_longer_gives_other_prompts_all_fresh(tmp_path, capsys):
    # vLLM's random dataset draws every prompt from one generator stream sized by the count,
    # so a longer pool is not the study's prompts plus more: the study's are drawn again at
    # its own count to know them, and none of them is sent.
    _study(tmp_path / "study", n_trials=4, workload=WorkloadSpec(
        name="random", num_prompts=3, random_input_len=24, output_len=16))
    assert cli.main(["verify", str(tmp_path / "study"), "--launches", "1"]) == 0, \
        capsys.readouterr().err
    study_dir = tmp_path / "study"
    study = st.open_existing(study_dir)
    sent = {p for t in study.trials if (cap := st.token_capture(study_dir, t))
            for p in _prompts(cap)}
    fresh = _prompts(tokens.TokenCapture.load(study_dir / "verify" / "0" / tokens.FILE_NAME))
    assert sent and fresh and not sent & set(fresh)

"""The rules that keep launches off what a study already knows (tuner.search.study), the sampled
space without the baseline (tuner.search.space), and trials.csv's one row per config and level
(tuner.analysis.recommend.configs_frame): pure, on in-memory Optuna studies."""

from __future__ import annotations

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution
from optuna.trial import TrialState, create_trial
from study_fakes import add_complete, add_failed, fake_level, ngram, realistic_study

from tuner.analysis.frame import configs_frame, trials_frame
from tuner.outputs import decision_words
from tuner.records.configs import TrialConfig
from tuner.search import outcomes, space
from tuner.search import study as st

ENGINE = "e1"
REFUSED = "vLLM exited with status 1 after 3 s, before /health answered: ValueError: k too big"


def _trial(study, config: TrialConfig | None, state: TrialState, *, kind: str | None = None,
           reason: str = REFUSED, log_tail: str = "", engine: str = ENGINE, **attrs):
    config = config or TrialConfig()
    user = {"config": config.model_dump(mode="json"), "key": config.key(),
            "role": "baseline" if config.method == "none" else "search",
            st.ENGINE_ATTR: engine, **attrs}
    if kind:
        user["failure"] = {"reason": reason, "kind": kind, "log_tail": log_tail}
    study.add_trial(create_trial(state=state, values=[1.0] if state == TrialState.COMPLETE
                                 else None, user_attrs=user))
    return study.trials[-1]


def _cfg(k: int) -> TrialConfig:
    return TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": k})


@pytest.fixture
def study():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    s = optuna.create_study(direction="maximize")
    _trial(s, None, TrialState.COMPLETE)  # the engine started: crashes are the configs' doing
    return s


def test_a_config_refused_at_start_is_known(study):
    first = _trial(study, _cfg(9), TrialState.FAIL, kind="engine_crashed")
    _trial(study, _cfg(9), TrialState.FAIL, kind="engine_crashed")
    assert st.rejected(study, engine=ENGINE) == {_cfg(9).key(): first}


@pytest.mark.parametrize("kind", ["engine_start_timeout", "engine_died", "measurement_failed",
                                  "worker_died", "driver_died", "failed"])
def test_failures_that_depend_on_the_moment_may_be_retried(study, kind):
    for _ in range(3):
        _trial(study, _cfg(3), TrialState.FAIL, kind=kind)
    assert st.rejected(study, engine=ENGINE) == {}


@pytest.mark.parametrize("reason,tail", [
    ("vLLM exited with status -9 after 20 s, before /health answered: Killed", ""),
    ("vLLM exited with status 1 after 30 s, before /health answered: RuntimeError",
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
])
def test_a_crash_that_looks_transient_is_retried_once(study, reason, tail):
    _trial(study, _cfg(4), TrialState.FAIL, kind="engine_crashed", reason=reason, log_tail=tail)
    assert st.rejected(study, engine=ENGINE) == {}
    _trial(study, _cfg(4), TrialState.FAIL, kind="engine_crashed", reason=reason, log_tail=tail)
    assert list(st.rejected(study, engine=ENGINE)) == [_cfg(4).key()]  # MAX_START_CRASHES


def test_a_refusal_holds_only_for_an_engine_that_started_something():
    s = optuna.create_study(direction="maximize")
    _trial(s, None, TrialState.FAIL, kind="engine_crashed")  # nothing ever started
    _trial(s, _cfg(2), TrialState.FAIL, kind="engine_crashed")
    assert st.rejected(s, engine=ENGINE) == {}  # the setup is suspect: fix it and rerun
    _trial(s, _cfg(5), TrialState.COMPLETE)
    assert list(st.rejected(s, engine=ENGINE)) == [TrialConfig().key(), _cfg(2).key()]
    assert st.rejected(s, engine="another engine setup") == {}


def test_a_known_failure_is_told_from_storage_and_not_counted(study):
    original = _trial(study, _cfg(9), TrialState.FAIL, kind="engine_crashed")
    trial = study.ask()
    outcomes.tell_known_failure(study, trial, original)
    told = study.trials[-1]
    assert told.state == TrialState.FAIL and told.user_attrs["duplicate_of"] == original.number
    assert told.user_attrs["failure"]["reason"] == REFUSED
    assert told.user_attrs["failure"]["kind"] == "engine_crashed"
    assert st.counted_trials(study) == 2  # the baseline and the one launch of k=9


def test_engine_digest_ignores_timeouts_but_not_flags(fake_spec):
    spec = fake_spec()
    assert st.engine_digest(spec) == st.engine_digest(spec.model_copy(
        update={"ready_timeout_s": 5.0, "request_timeout_s": 1.0}))
    assert st.engine_digest(spec) != st.engine_digest(spec.model_copy(
        update={"extra_args": (*spec.extra_args, "--max-num-seqs", "8")}))


def test_failure_summary_names_the_most_common_failure(tmp_path):
    s = optuna.create_study(direction="maximize")
    _trial(s, None, TrialState.FAIL, kind="engine_start_timeout", reason="no /health in 900 s")
    for k in (2, 3, 4):
        _trial(s, _cfg(k), TrialState.FAIL, kind="engine_crashed", reason=f"refused k={k}.")
    _trial(s, _cfg(2), TrialState.FAIL, kind="engine_crashed", reason="refused k=2.",
           duplicate_of=2)  # answered from storage: not counted
    line = decision_words.no_answer_text(st.failure_summary(s, tmp_path))
    assert line == (f"All 4 trials failed; most common: engine_crashed x3: refused k=4. Fix the "
                    f"cause and rerun the same command (finished trials are kept). Logs: "
                    f"{tmp_path / 'trials' / '3' / 'engine.log'}")


def test_failure_summary_without_a_baseline_names_the_baselines_failure(tmp_path):
    s = realistic_study(with_failures=False)
    assert st.failure_summary(s, tmp_path) is None
    s = optuna.create_study(directions=["maximize", "minimize"])
    add_failed(s, None, role="baseline", reason="vLLM exited with status 1: no GPU",
               kind="engine_crashed")
    add_complete(s, ngram(5), [fake_level(1, output_throughput=40.0, mean_tpot_ms=20.0)])
    line = decision_words.no_answer_text(st.failure_summary(s, tmp_path))
    assert line.startswith("The baseline (no speculation) did not complete, so no speedup can "
                           "be measured though 1 speculative trial(s) did; most common: "
                           "engine_crashed x1: vLLM exited with status 1: no GPU.")
    assert line.endswith(str(tmp_path / "trials" / "0" / "engine.log"))


def test_samplers_never_draw_the_baseline_and_old_studies_keep_their_choices(tmp_path):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    sp = space.load("ngram")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(100):
        trial = study.ask()
        assert sp.suggest(trial).method == "ngram"
        study.tell(trial, 0.0)
    assert st.method_choices(study) is None
    # A study stored while the baseline was a choice: its journal refuses other choices.
    old = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0), storage=(
        JournalStorage(JournalFileBackend(str(tmp_path / "study.journal")))))
    old.add_trial(create_trial(params={"method": "none"}, value=1.0, distributions={
        "method": CategoricalDistribution(("none", "ngram"))}))
    choices = st.method_choices(old)
    assert choices == ("none", "ngram")
    with pytest.raises(ValueError, match="dynamic value space"):
        trial = old.ask()
        sp.suggest(trial)
    old.tell(trial, state=TrialState.FAIL)
    for _ in range(20):
        trial = old.ask()
        sp.suggest(trial, method_choices=choices)
        old.tell(trial, 0.0)
    assert sp.baseline() == TrialConfig() and sp.params_of(space.Point(method="none")) is None


def test_old_style_waiting_baseline_is_still_the_baseline():
    s = optuna.create_study()
    s.enqueue_trial({"method": "none"}, user_attrs={"role": "baseline"})
    (waiting,) = s.get_trials(states=(TrialState.WAITING,))
    assert st.is_baseline(waiting)
    s.add_trial(create_trial(params={"ngram.k": 3}, value=1.0, user_attrs={
        "config": _cfg(3).model_dump(mode="json")},
        distributions={"ngram.k": IntDistribution(1, 8)}))
    assert not st.is_baseline(s.trials[-1])


def test_configs_frame_lists_each_config_once_per_level():
    df = trials_frame(realistic_study())
    configs = configs_frame(df)
    assert not configs.duplicated(["config_key", "concurrency"]).any()
    done = configs[configs["state"] == "COMPLETE"]
    assert len(done) == 8 * 2  # baseline + 7 speculative configs; trial 8 is a copy of 1
    ng5 = done[(done["config_key"] == TrialConfig(speculative_config=ngram(5)).key())
               & (done["concurrency"] == 1)].iloc[0]
    assert ng5["trial"] == 1 and ng5["n_measurements"] == 3
    assert ng5["output_throughput"] == pytest.approx(47.7)  # median of 46.9, 47.7, 48.4
    failed = configs[configs["state"] == "FAIL"]
    assert len(failed) == 1 and failed.iloc[0]["n_failed"] == 1
    assert failed.iloc[0]["failure_kind"] == "engine_crashed"
    assert (configs["state"] == "RUNNING").sum() == 1

"""The search loop keeps each trial's token capture (tuner/search/loop.py, tuner/search/study.py).

No engine: an executor stands in for a Ray worker on another host, whose trial folder the
driver never sees, so the capture reaches the study only as the outcome's bytes; and for the
inline executor, whose worker already wrote the same file in place.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
from study_fakes import fake_level

from tuner.outputs import decision_words, decisions
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, Workload, WorkloadSpec
from tuner.records.decisions import PathLeft
from tuner.records.options import OptimizeOptions, OptimizePlan
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.records.storage import TrialAttr
from tuner.records.trials import TrialOutcome
from tuner.search import loop, outcomes, trials
from tuner.search import space as spaces
from tuner.search import study as st
from tuner.tokens import FILE_NAME, RequestTokens, TokenCapture


def _capture(seed: int) -> TokenCapture:
    rng = np.random.default_rng(seed)
    return TokenCapture(requests=tuple(
        RequestTokens(concurrency=1, index=i, warmup=i == 0,
                      prompt=rng.integers(1, 1000, 6, dtype=np.int32),
                      output=rng.integers(1, 1000, 4 + i, dtype=np.int32), max_tokens=8)
        for i in range(3)))


class _Executor:
    """Answers every trial at once, as a worker would: with a capture, written in place
    (`inline`) or only carried back (a Ray worker on another host)."""

    parallel = 1

    def __init__(self, *, inline: bool, tokens: bool = True) -> None:
        self.inline, self.tokens = inline, tokens
        self.done: list[tuple[int, TrialOutcome]] = []
        self.written: dict[int, bytes] = {}

    def submit(self, key, engine, config: TrialConfig, workload, settings, trial_dir: str,
               *, num_gpus: float = 0, schedule=None) -> None:
        data = _capture(key).to_bytes() if self.tokens else None
        if self.inline and data is not None:
            Path(trial_dir).mkdir(parents=True)
            (Path(trial_dir) / FILE_NAME).write_bytes(data)
        if data is not None:
            self.written[key] = data
        result = BenchResult(config=config, engine=EngineInfo(start_s=1.0), levels=(
            LevelMetrics(**fake_level(1, output_throughput=100.0, mean_tpot_ms=10.0)),))
        self.done.append((key, TrialOutcome(result=result, tokens=data)))

    def wait_one(self):
        return self.done.pop(0)


WORKLOAD = WorkloadSpec(name="random")


def _plan(*, out_dir: Path, aligned_baseline="auto", **given) -> OptimizePlan:
    """A plan as tuner.api hands it to the loop: resolved (an EngineSpec, a target level)."""
    options = OptimizeOptions(**{"workload": WORKLOAD, "settings": MeasureSettings(),
                                 "objectives": ("output_throughput", "mean_tpot_ms"), **given})
    return OptimizePlan(options=options, engine=EngineSpec(model="m"), study_name="s",
                        out_dir=out_dir, target_concurrency=1, aligned_baseline=aligned_baseline)


def _run(out: Path, executor: _Executor, lines: list[str]) -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    sp = spaces.parse({"methods": {"ngram": {"num_speculative_tokens": {
        "type": "choice", "values": [2]}, "prompt_lookup_max": 3, "prompt_lookup_min": 2}}})
    loop.enqueue_start(study, sp, "grid", [])
    search = loop.SearchLoop(
        plan=_plan(out_dir=out, aligned_baseline="off"), study=study, space=sp,
        workload=Workload(spec=WORKLOAD, prompts=()), executor=executor, gpus=0.0,
        output=loop.LoopOutput(record=decisions.Narrator(
            None, say=lines.append, trial_line=lambda result, _base: result.config.label())))
    search.run(n_trials=2, timeout_s=None)
    return study


def test_a_remote_trial_s_capture_is_written_beside_it_and_named_in_its_attrs(tmp_path):
    out = tmp_path / "study"
    executor = _Executor(inline=False)
    study = _run(out, executor, [])
    trials = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(trials) == 2
    for t in trials:
        path = out / "trials" / str(t.number) / FILE_NAME
        assert path.read_bytes() == executor.written[t.number]
        assert t.user_attrs[TrialAttr.TOKENS] == {
            "file": f"trials/{t.number}/{FILE_NAME}", "requests": 2,
            "output_tokens": 5 + 6}
        loaded = st.token_capture(out, t)
        assert [r.output.tolist() for r in loaded.requests] == \
            [r.output.tolist() for r in _capture(t.number).requests]
    assert not list(out.rglob("*.tmp"))


def test_an_inline_trial_s_identical_file_is_left_in_place(tmp_path):
    out = tmp_path / "study"
    executor = _Executor(inline=True)
    before: dict[int, int] = {}
    original_submit = executor.submit

    def submit(key, *args, **kwargs):
        original_submit(key, *args, **kwargs)
        before[key] = (out / "trials" / str(key) / FILE_NAME).stat().st_ino

    executor.submit = submit
    study = _run(out, executor, [])
    for t in study.get_trials(states=(optuna.trial.TrialState.COMPLETE,)):
        path = out / "trials" / str(t.number) / FILE_NAME
        assert path.stat().st_ino == before[t.number]  # not rewritten
        assert st.token_capture(out, t) is not None


def test_no_capture_no_attr_and_a_broken_capture_is_said(tmp_path):
    out = tmp_path / "study"
    study = _run(out, _Executor(inline=False, tokens=False), [])
    for t in study.get_trials():
        assert TrialAttr.TOKENS not in t.user_attrs and st.token_capture(out, t) is None
    assert not list(out.rglob(FILE_NAME))

    class Garbage(_Executor):
        def submit(self, key, *args, **kwargs):
            super().submit(key, *args, **kwargs)
            key, outcome = self.done.pop()
            self.done.append((key, outcome.model_copy(update={"tokens": b"not a capture"})))

    lines: list[str] = []
    study = _run(tmp_path / "garbage", Garbage(inline=False), lines)
    assert all(TrialAttr.TOKENS not in t.user_attrs for t in study.get_trials())
    assert sum("token capture came back unreadable" in ln for ln in lines) == 2


def test_a_missing_or_corrupt_capture_file_reads_as_none(tmp_path):
    out = tmp_path / "study"
    study = _run(out, _Executor(inline=False), [])
    first, second = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    (out / first.user_attrs[TrialAttr.TOKENS]["file"]).unlink()
    path = out / second.user_attrs[TrialAttr.TOKENS]["file"]
    path.write_bytes(path.read_bytes()[:40])  # truncated
    assert st.token_capture(out, first) is None
    assert st.token_capture(out, second) is None


# --- --aligned-baseline: auto, off, explicit -------------------------------------------------
class _PathExecutor(_Executor):
    """An engine whose path is what vLLM 0.26 takes on a GPU: V2 runner with async scheduling,
    except where a speculative config (`differs`) or the aligning flags and environment put it
    on V1 without async scheduling, as tuner.measure.enginepath reads them from the log."""

    def __init__(self, *, differs: bool) -> None:
        super().__init__(inline=False, tokens=False)
        self.differs = differs
        self.configs: list[TrialConfig] = []

    def submit(self, key, engine, config: TrialConfig, *args, **kwargs) -> None:
        self.configs.append(config)
        aligned = config.engine_args.get("no_async_scheduling") is True and \
            config.engine_env.get("VLLM_USE_V2_MODEL_RUNNER") == "0"
        off = aligned or (self.differs and config.speculative_config is not None)
        details = {"model_runner": "V1" if off else "V2",
                   "async_scheduling": "false" if off else "true"}
        result = BenchResult(config=config, engine=EngineInfo(start_s=1.0, details=details),
                             levels=(LevelMetrics(**fake_level(
                                 1, output_throughput=100.0, mean_tpot_ms=10.0)),))
        self.done.append((key, TrialOutcome(result=result)))


ALIGNED = TrialConfig(engine_args={"no_async_scheduling": True},
                      engine_env={"VLLM_USE_V2_MODEL_RUNNER": "0"})


def _search(study, executor, lines: list[str], *, aligned,
            detail: list[str] | None = None, notes: list | None = None
            ) -> loop.SearchLoop:
    sp = spaces.parse({"methods": {"ngram": {"num_speculative_tokens": {
        "type": "choice", "values": [1, 2, 3, 4]}, "prompt_lookup_max": 3,
        "prompt_lookup_min": 2}}})
    loop.enqueue_start(study, sp, "grid", [])
    return loop.SearchLoop(
        plan=_plan(out_dir=Path("unused"), objectives=("output_throughput",),
                   aligned_baseline=aligned),
        study=study, space=sp, workload=Workload(spec=WORKLOAD, prompts=()), executor=executor,
        gpus=0.0, output=loop.LoopOutput(record=_recorder(
            decisions.Narrator(None, say=lines.append,
                               detail=None if detail is None else detail.append,
                               trial_line=lambda result, _base: result.config.label()),
            notes)))


def _recorder(narrator, notes: list | None):
    """The narrator's lines, and each decision kept in `notes` as the study folder would."""
    def record(event, *, store=True, show=True):
        if store and notes is not None and event.topic is not None:
            notes.append(event)
        narrator(event, store=store, show=show)
    return record


def _study() -> optuna.Study:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0))


def _roles(study) -> list[str]:
    """The roles of the trials that ran, in the order they started (grid points wait)."""
    ran = [t for t in study.trials if t.state != optuna.trial.TrialState.WAITING]
    return [t.user_attrs[TrialAttr.ROLE] for t in sorted(ran, key=lambda t: t.datetime_start)]


def test_auto_alignment_measures_the_speculative_path_once_right_after_it_is_seen():
    study, executor, lines, detail, notes = _study(), _PathExecutor(differs=True), [], [], []
    _search(study, executor, lines, aligned="auto", detail=detail,
            notes=notes).run(n_trials=4, timeout_s=None)
    assert _roles(study) == ["baseline", "search", "aligned_baseline", "search"]
    assert executor.configs[2] == ALIGNED
    # One short line by default; the paths and the knobs with -v and in the report.
    assert [ln for ln in lines if "engine path" in ln.lower()] == [
        "Aligned baseline: trial 1 (ngram k=1 window 2-3) left the plain baseline's engine "
        "path; measuring a baseline on that path once."]
    said = [ln for ln in detail if ln.startswith("Engine path:")]
    assert len(said) == 1 and "model_runner: V2 without speculation, V1 with it" in said[0]
    assert "--no-async-scheduling VLLM_USE_V2_MODEL_RUNNER=0" in said[0]
    assert [(e.topic, e.slot()) for e in notes] == [("engine_path", "decision")]
    assert isinstance(notes[0], PathLeft) and notes[0].trial == 1
    assert notes[0].knobs == ("--no-async-scheduling", "VLLM_USE_V2_MODEL_RUNNER=0")
    assert decision_words.text(notes[0]) == said[0].removeprefix("Engine path: ")
    assert trials.aligned_config(study) == ALIGNED


def test_auto_alignment_adds_no_launch_where_speculation_keeps_the_path():
    study, executor, lines, detail = _study(), _PathExecutor(differs=False), [], []
    _search(study, executor, lines, aligned="auto", detail=detail).run(n_trials=4,
                                                                       timeout_s=None)
    assert _roles(study) == ["baseline", "search", "search", "search"]
    assert all(c.method != "none" or c == TrialConfig() for c in executor.configs)
    # Nothing to decide: said with -v only.
    assert sum("no aligned baseline to measure" in ln for ln in detail) == 1
    assert not any("engine path" in ln.lower() for ln in lines)
    assert trials.aligned_config(study) is None


def test_a_resumed_study_never_launches_the_aligned_baseline_twice():
    study, executor = _study(), _PathExecutor(differs=True)
    # The budget ends with the first speculative trial: the resumed run aligns first, once.
    _search(study, executor, [], aligned="auto").run(n_trials=2, timeout_s=None)
    assert _roles(study) == ["baseline", "search"]
    _search(study, executor, [], aligned="auto").run(n_trials=3, timeout_s=None)
    _search(study, executor, [], aligned="auto").run(n_trials=5, timeout_s=None)
    assert _roles(study).count("aligned_baseline") == 1
    assert _roles(study)[2] == "aligned_baseline"


def test_an_aligned_baseline_a_dead_driver_left_is_launched_again():
    study, executor = _study(), _PathExecutor(differs=True)
    _search(study, executor, [], aligned="auto").run(n_trials=2, timeout_s=None)
    orphan = outcomes.ask_fresh(study, user_attrs=outcomes.aligned_attrs(ALIGNED))
    study._storage.set_trial_user_attr(orphan._trial_id, TrialAttr.FAILURE,
                                       {"reason": "x", "kind": "driver_died"})
    study._storage.set_trial_state_values(orphan._trial_id, optuna.trial.TrialState.FAIL)
    assert not trials.has_aligned_baseline(study)
    _search(study, executor, [], aligned="auto").run(n_trials=3, timeout_s=None)
    done = study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert [t.user_attrs[TrialAttr.ROLE] for t in done].count("aligned_baseline") == 1


def test_off_never_aligns_and_an_explicit_one_follows_the_baseline_whatever_the_path():
    study, executor, lines = _study(), _PathExecutor(differs=True), []
    _search(study, executor, lines, aligned="off").run(n_trials=3, timeout_s=None)
    assert "aligned_baseline" not in _roles(study)
    assert not any(ln.startswith("Engine path:") for ln in lines)

    given = TrialConfig(engine_args={"no_async_scheduling": True})
    study, executor = _study(), _PathExecutor(differs=False)
    search = _search(study, executor, [], aligned=given)
    search.run(n_trials=3, timeout_s=None)
    assert _roles(study) == ["baseline", "aligned_baseline", "search"]
    assert executor.configs[1] == given
    # --repeats re-measures it beside the plain baseline: the path's cost gets a spread too.
    search.repeat_leaders(repeats=2, leaders=1)
    roles = {t.number: t.user_attrs[TrialAttr.ROLE] for t in study.trials}
    repeated = [roles[t.user_attrs[TrialAttr.REPEAT_OF]] for t in study.trials
                if t.user_attrs[TrialAttr.ROLE] == "repeat"]
    assert repeated == ["baseline", "aligned_baseline", "search"]


def test_an_aligned_baseline_that_missed_the_speculative_path_is_said_once():
    class EnvIgnored(_PathExecutor):
        """An engine that honours --no-async-scheduling but not VLLM_USE_V2_MODEL_RUNNER."""

        def submit(self, key, engine, config: TrialConfig, *args, **kwargs) -> None:
            super().submit(key, engine, config, *args, **kwargs)
            if config.engine_args.get("no_async_scheduling"):
                key, outcome = self.done.pop()
                engine_info = outcome.result.engine.model_copy(update={"details": {
                    "model_runner": "V2", "async_scheduling": "false"}})
                self.done.append((key, outcome.model_copy(update={
                    "result": outcome.result.model_copy(update={"engine": engine_info})})))

    lines: list[str] = []
    _search(_study(), EnvIgnored(differs=True), lines, aligned="auto").run(n_trials=4,
                                                                           timeout_s=None)
    missed = [ln for ln in lines if "still differs" in ln]
    assert len(missed) == 1 and "model_runner: V2 without speculation, V1 with it" in missed[0]
    lines.clear()
    _search(_study(), _PathExecutor(differs=True), lines, aligned="auto").run(n_trials=4,
                                                                              timeout_s=None)
    assert not any("still differs" in ln for ln in lines)

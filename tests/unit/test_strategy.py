"""The strategy interface (tuner/search/strategy.py): the loop launches what a strategy asks
for, in its order and roles, tells it each outcome, and ends on its Stop; a sequential
strategy is asked again only once its launch is told. No engine: an executor answers every
trial at once (a scripted failure for one config)."""

from __future__ import annotations

from pathlib import Path

import optuna
from study_fakes import fake_level

from tuner.outputs import decisions
from tuner.records.configs import EngineSpec, MeasureSettings, TrialConfig, Workload, WorkloadSpec
from tuner.records.options import OptimizeOptions, OptimizePlan
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.records.storage import TrialAttr
from tuner.records.trials import Failure, Role, TrialOutcome
from tuner.search import loop
from tuner.search import space as spaces
from tuner.search.strategy import Launch, OptunaSearch, Stop, StopReason

NG = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                     "prompt_lookup_min": 2, "prompt_lookup_max": 3})
BAD = NG.with_k(4)
WORKLOAD = WorkloadSpec(name="random")


class _Executor:
    """Answers each trial as it is submitted; `BAD` fails at start. `parallel` trials at once."""

    def __init__(self, parallel: int = 1) -> None:
        self.parallel = parallel
        self.done: list[tuple[int, TrialOutcome]] = []
        self.most_in_flight = 0

    def submit(self, key, engine, config: TrialConfig, *_args, **_kw) -> None:
        if config.key() == BAD.key():
            outcome = TrialOutcome(failure=Failure(reason="refused", kind="engine_crashed"))
        else:
            outcome = TrialOutcome(result=BenchResult(config=config, engine=EngineInfo(
                start_s=1.0), levels=(LevelMetrics(**fake_level(
                    1, output_throughput=100.0, mean_tpot_ms=10.0)),)))
        self.done.append((key, outcome))
        self.most_in_flight = max(self.most_in_flight, len(self.done))

    def wait_one(self):
        return self.done.pop(0)


def _loop(tmp_path: Path, executor: _Executor, lines: list[str]) -> loop.SearchLoop:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    sp = spaces.parse({"methods": {"ngram": {"num_speculative_tokens": {
        "type": "choice", "values": [2, 4]}, "prompt_lookup_max": 3, "prompt_lookup_min": 2}}})
    options = OptimizeOptions(workload=WORKLOAD, settings=MeasureSettings(),
                              objectives=("output_throughput", "mean_tpot_ms"))
    plan = OptimizePlan(options=options, engine=EngineSpec(model="m"), study_name="s",
                        out_dir=tmp_path, target_concurrency=1, aligned_baseline="off")
    return loop.SearchLoop(plan=plan, study=study, space=sp,
                           workload=Workload(spec=WORKLOAD, prompts=()), executor=executor,
                           gpus=0.0, output=loop.LoopOutput(
                               record=decisions.Narrator(None, say=lines.append)))


class _Scripted:
    """Launches its script in order, then stops; records what it was told."""

    sequential = True
    counts_repeats = True

    def __init__(self, script: list[Launch]) -> None:
        self.script = list(script)
        self.told: list[tuple[Role, int | None]] = []

    def ask(self, view) -> Launch | Stop:
        return self.script.pop(0) if self.script else Stop(StopReason.DECIDED)

    def tell(self, launch: Launch, trial) -> None:
        self.told.append((launch.role, None if trial is None else trial.number))


def test_the_loop_launches_what_the_strategy_asks_in_its_order_and_roles(tmp_path):
    executor = _Executor(parallel=4)
    search = _loop(tmp_path, executor, [])
    scripted = _Scripted([Launch(TrialConfig(), Role.BASELINE), Launch(NG, Role.CONFIRM),
                          Launch(BAD, Role.CONFIRM), Launch(NG, Role.REPEAT, repeat_of=1)])
    stop = search.run(scripted, n_trials=9, timeout_s=None)
    assert stop == Stop(StopReason.DECIDED)
    # The failed launch is told as None; a sequential strategy never has two in flight.
    assert scripted.told == [(Role.BASELINE, 0), (Role.CONFIRM, 1), (Role.CONFIRM, None),
                             (Role.REPEAT, 3)]
    assert executor.most_in_flight == 1
    trials = search.study.get_trials()
    assert [t.user_attrs[TrialAttr.ROLE] for t in trials] == [
        "baseline", "confirm", "confirm", "repeat"]
    assert [t.user_attrs[TrialAttr.CONFIG_KEY] for t in trials] == [
        TrialConfig().key(), NG.key(), BAD.key(), NG.key()]
    assert trials[3].user_attrs[TrialAttr.REPEAT_OF] == 1
    assert TrialConfig.model_validate(trials[1].user_attrs[TrialAttr.CONFIG_OVERRIDE]) == NG
    assert search.room() is None and search.done() == 4  # repeats count for this strategy


def test_room_says_which_budget_ran_out(tmp_path):
    search = _loop(tmp_path, _Executor(), [])
    scripted = _Scripted([Launch(TrialConfig(), Role.BASELINE)])
    search.run(scripted, n_trials=1, timeout_s=None)
    assert search.room() == StopReason.BUDGET
    search.run(_Scripted([]), n_trials=5, timeout_s=-1.0)
    assert search.room() == StopReason.TIMEOUT


def test_optuna_samplers_stop_on_the_budget_and_on_a_space_they_exhausted(tmp_path):
    lines: list[str] = []
    search = _loop(tmp_path, _Executor(), lines)
    loop.enqueue_start(search.study, search.space, "grid", [])
    # The baseline and the space's two configs (one the engine refuses), then nothing left.
    stop = search.run(OptunaSearch(), n_trials=10, timeout_s=None)
    assert stop == Stop(StopReason.EXHAUSTED)
    assert lines[-1] == ("Every config of search space '<space>' (2) is measured or refused; "
                         "stopping the search.")
    assert len(search.study.get_trials()) == 3
    assert search.run(n_trials=2, timeout_s=None) == Stop(StopReason.BUDGET)

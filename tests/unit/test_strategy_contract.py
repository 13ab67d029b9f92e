"""The strategy contract (tuner/search/strategy.py Strategy), run against every strategy, as
Optuna runs one test case against every sampler: whatever it decides, a strategy asks only
for configs of the space, stops where the budget ends, takes a failed launch as data, and
never launches a config it launched before unless it asks for a repeat.

No engine: an executor answers every trial at once with figures and token ids (repeating
text, so n-gram drafts are accepted), the `fail` launches failing at start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna
import pytest
from study_fakes import fake_level, fake_settings

from tuner.records.configs import (
    EngineLimits,
    EngineSpec,
    MeasureSettings,
    TrialConfig,
    Workload,
    WorkloadSpec,
)
from tuner.records.options import OptimizeOptions, OptimizePlan
from tuner.records.results import BenchResult, EngineInfo, LevelMetrics
from tuner.records.storage import TrialAttr
from tuner.records.trials import Failure, Role, TrialOutcome
from tuner.search import loop
from tuner.search import space as spaces
from tuner.search import study as st
from tuner.search.replay_strategy import ReplaySearch
from tuner.search.strategy import OptunaSearch, Repeats, Stop, StopReason
from tuner.tokens import RequestTokens, TokenCapture

SPACE = {"methods": {"ngram": {
    "num_speculative_tokens": {"type": "choice", "values": [2, 4, 6]},
    "prompt_lookup_max": {"type": "choice", "values": [3, 5]}, "prompt_lookup_min": 2}}}
LEVELS = (1, 2)
WORKLOAD = WorkloadSpec(name="random")
LIMITS = EngineLimits(max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=2048)


def _capture() -> bytes:
    """Token ids of every level's requests: a repeating phrase the n-gram proposer drafts."""
    phrase = np.array([5, 9, 14, 3, 7, 11, 2, 8])
    return TokenCapture(requests=tuple(
        RequestTokens(concurrency=c, index=i, warmup=False,
                      prompt=np.concatenate([phrase, phrase, [i]]),
                      output=np.tile(phrase, 6), max_tokens=48)
        for c in LEVELS for i in range(4))).to_bytes()


class _Executor:
    """Answers each trial as it is submitted; the launches numbered in `fail` (0: the first)
    fail at start. Records every launch: (trial number, config key)."""

    parallel = 2

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        self.fail = fail
        self.launched: list[tuple[int, str]] = []
        self.done: list[tuple[int, TrialOutcome]] = []

    def submit(self, key, engine, config: TrialConfig, *_args, **_kw) -> None:
        if len(self.launched) in self.fail:
            outcome = TrialOutcome(failure=Failure(reason="refused", kind="engine_crashed"))
        else:
            k = config.k or 0
            outcome = TrialOutcome(tokens=_capture(), result=BenchResult(
                config=config, engine=EngineInfo(start_s=1.0), levels=tuple(
                    LevelMetrics(**fake_level(
                        c, output_throughput=100.0 * c * (1 + 0.05 * k), mean_tpot_ms=10.0,
                        acceptance_length=1 + 0.3 * k if k else None, k=k or None))
                    for c in LEVELS)))
        self.launched.append((key, config.key()))
        self.done.append((key, outcome))

    def wait_one(self):
        return self.done.pop(0)


def _loop(tmp_path: Path, executor: _Executor) -> loop.SearchLoop:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    st.store_settings(study, fake_settings(concurrencies=LEVELS))
    options = OptimizeOptions(workload=WORKLOAD, settings=MeasureSettings(concurrencies=LEVELS),
                              objectives=("output_throughput", "mean_tpot_ms"))
    plan = OptimizePlan(options=options, engine=EngineSpec(model="m"), study_name="s",
                        out_dir=tmp_path, target_concurrency=1, aligned_baseline="off")
    return loop.SearchLoop(plan=plan, study=study, space=spaces.parse(SPACE),
                           workload=Workload(spec=WORKLOAD, prompts=()), executor=executor,
                           gpus=0.0)


@dataclass(frozen=True)
class Case:
    """One strategy: `run(search, budget)` runs it on the loop, `budget` launches at most
    (Repeats: after a search of that budget, its repeats, outside it); how it stopped."""

    name: str
    strategy: type
    run: Callable[[loop.SearchLoop, int], Stop]
    # how many launches a run of `budget` may make (Repeats: its own, after the search's)
    most: Callable[[int], int] = lambda budget: budget


def _optuna(sampler: str) -> Callable[[loop.SearchLoop, int], Stop]:
    def run(search: loop.SearchLoop, budget: int) -> Stop:
        loop.enqueue_start(search.study, search.space, sampler, [])
        return search.run(OptunaSearch(), n_trials=budget, timeout_s=None)
    return run


def _replay(search: loop.SearchLoop, budget: int) -> Stop:
    return search.run(ReplaySearch(study_dir=search.out_dir, limits=LIMITS), n_trials=budget,
                      timeout_s=None)


def _repeats(search: loop.SearchLoop, budget: int) -> Stop:
    _optuna("grid")(search, budget)
    return search.repeat_leaders(repeats=2, leaders=1)


CASES = [Case("optuna-grid", OptunaSearch, _optuna("grid")),
         Case("optuna-random", OptunaSearch, _optuna("random")),
         Case("replay", ReplaySearch, _replay),
         # the search's launches, then one repeat of the baseline and of the leader
         Case("repeats", Repeats, _repeats, most=lambda budget: budget + 2)]


@pytest.fixture(params=CASES, ids=lambda case: case.name)
def case(request) -> Case:
    return request.param


def _allowed(search: loop.SearchLoop) -> set[str]:
    """The config keys of the space: its grid and its baseline."""
    return {search.space.baseline().key()} | {
        search.space.config_from_params(p).key() for p in search.space.grid()}


def test_a_strategy_asks_only_for_configs_of_the_space(tmp_path, case):
    executor = _Executor()
    search = _loop(tmp_path, executor)
    case.run(search, 5)
    assert executor.launched
    assert {key for _, key in executor.launched} <= _allowed(search)


@pytest.mark.parametrize("budget", [1, 4])
def test_a_strategy_stops_where_the_budget_ends(tmp_path, case, budget):
    executor = _Executor()
    search = _loop(tmp_path, executor)
    stop = case.run(search, budget)
    assert isinstance(stop, Stop)
    assert 1 <= len(executor.launched) <= case.most(budget)
    if case.name == "repeats":
        assert stop.reason == StopReason.REPEATED
        return
    # asked again on a spent budget, it launches nothing more
    assert isinstance(case.run(search, budget), Stop)
    assert len(executor.launched) <= case.most(budget)


@pytest.mark.parametrize("fail", [0, 1])
def test_a_failed_launch_is_data_not_a_crash(tmp_path, case, fail):
    executor = _Executor(fail=frozenset({fail}))
    search = _loop(tmp_path, executor)
    stop = case.run(search, 5)
    assert isinstance(stop, Stop)
    number, _ = executor.launched[fail]
    failed = search.study.trials[number]
    assert failed.state == optuna.trial.TrialState.FAIL
    assert failed.user_attrs[TrialAttr.FAILURE]["kind"] == "engine_crashed"


def test_a_strategy_never_launches_a_twin_unless_it_asks_for_a_repeat(tmp_path, case):
    executor = _Executor()
    search = _loop(tmp_path, executor)
    case.run(search, 8)
    seen: set[str] = set()
    for number, key in executor.launched:
        role = search.study.trials[number].user_attrs[TrialAttr.ROLE]
        if key in seen:
            assert role == Role.REPEAT, f"trial {number} relaunched {key} as {role}"
        seen.add(key)


def test_every_strategy_of_the_package_is_under_contract():
    # A class of tuner.search with ask and tell is a strategy: it joins CASES.
    import importlib
    import inspect
    import pkgutil

    import tuner.search

    found = set()
    for info in pkgutil.iter_modules(tuner.search.__path__):
        module = importlib.import_module(f"tuner.search.{info.name}")
        found |= {cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if cls.__module__ == module.__name__ and callable(getattr(cls, "ask", None))
                  and callable(getattr(cls, "tell", None))
                  and not getattr(cls, "_is_protocol", False)}
    assert found == {case.strategy for case in CASES}

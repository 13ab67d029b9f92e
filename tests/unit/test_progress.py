"""What a person sees while a study runs (tuner/outputs/console.py TrialProgress and
trial_line, the lines and counts of tuner/search/loop.py and tuner/search/replay_strategy.py).

No engine: executors stand in for the inline one (the trial reports its own progress) and for
a Ray worker (whose lines never reach the terminal, so the driver says what it hands out).
"""

from __future__ import annotations

import time

import optuna
import pytest
from study_fakes import fake_level

from tuner.outputs import console, decisions
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
from tuner.records.trials import Failure, TrialOutcome
from tuner.search import loop, replay_strategy, strategy
from tuner.search import space as spaces

SPACE = {"methods": {"ngram": {"num_speculative_tokens": {"type": "choice", "values": [2, 3, 4]},
                               "prompt_lookup_max": 3, "prompt_lookup_min": 2}}}


def _result(config: TrialConfig, *, tput: float, start_s: float = 42.0) -> BenchResult:
    levels = tuple(LevelMetrics(**fake_level(c, output_throughput=tput * c, mean_tpot_ms=20.0,
                                             acceptance_length=None if config.method == "none"
                                             else 2.5, k=2))
                   for c in (1, 4))
    return BenchResult(config=config, engine=EngineInfo(start_s=start_s), levels=levels)


class _Remote:
    """A Ray-like executor: no progress callback, outcomes come back at wait_one."""

    parallel = 1

    def __init__(self, *, fail: set[int] = frozenset(), sleep_s: float = 0.0) -> None:
        self.fail, self.sleep_s = fail, sleep_s
        self.done: list[tuple[int, TrialOutcome]] = []
        self.options: list[dict] = []

    def submit(self, key, engine, config: TrialConfig, workload, settings, trial_dir: str,
               *, num_gpus: float = 0, schedule=None, **options) -> None:
        self.options.append(options)
        time.sleep(self.sleep_s)  # inline executors run the whole trial inside submit
        if key in self.fail:
            outcome = TrialOutcome(failure=Failure(reason="vLLM exited with status 1 after 3 s",
                                                   kind="engine_crashed", log_tail="boom"))
        else:
            outcome = TrialOutcome(result=_result(config, tput=100.0 + 10 * key))
        self.done.append((key, outcome))

    def wait_one(self):
        return self.done.pop(0)


class _Inline(_Remote):
    reports_progress = True

    def submit(self, key, *args, progress=None, show_bar=False, **kw) -> None:
        progress(f"engine starting for trial {key} (log: x)")
        progress("engine ready in 3 s")
        super().submit(key, *args, progress=progress, show_bar=show_bar, **kw)


def _loop(tmp_path, executor, lines, ticks, *, show_bar=False, detail=None
          ) -> loop.SearchLoop:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"],
                                sampler=optuna.samplers.RandomSampler(seed=0))
    sp = spaces.parse(SPACE)
    loop.enqueue_start(study, sp, "grid", [])
    options = OptimizeOptions(
        workload=WorkloadSpec(name="random"), settings=MeasureSettings(concurrencies=(1, 4)),
        objectives=("output_throughput", "mean_tpot_ms"))
    plan = OptimizePlan(options=options, engine=EngineSpec(model="m"), aligned_baseline="off",
                        study_name="s", out_dir=tmp_path, target_concurrency=1)
    shown = None if detail is None else detail.append
    output = loop.LoopOutput(
        record=decisions.Narrator(None, say=lines.append, detail=shown,
                                  trial_line=console.trial_line),
        say=lines.append, tick=lambda done, total: ticks.append((done, total)),
        show_bar=show_bar, detail=shown)
    return loop.SearchLoop(
        plan=plan, study=study, space=sp,
        workload=Workload(spec=options.workload, prompts=()), executor=executor, gpus=0.0,
        output=output)


def test_each_finished_trial_has_one_line_with_done_of_total_its_figures_and_wall_time(
        tmp_path):
    lines, ticks = [], []
    search = _loop(tmp_path, _Remote(fail={2}), lines, ticks)
    search.run(n_trials=3, timeout_s=None)
    done = [ln for ln in lines if ln.startswith("[")]
    assert done[0] == ("[1/3] trial 0 baseline (no speculation): c=1 100.0 tok/s TPOT 20.0 ms "
                       "| c=4 400.0 tok/s TPOT 20.0 ms | engine start 42 s (0 s)")
    # A speculative trial: speedup over the baseline first, then its figures, per level.
    assert done[1].startswith("[2/3] trial 1 ngram k=2 window 2-3: c=1 1.10x 110.0 tok/s "
                              "TPOT 20.0 ms acc 2.50 | c=4 1.10x 440.0 tok/s")
    assert done[2].startswith("[3/3] trial 2 ngram k=3 window 2-3: FAIL (engine_crashed) vLLM "
                              "exited with status 1 after 3 s -- recorded; the study continues")
    assert done[2].endswith(f"Log: {tmp_path / 'trials' / '2' / 'engine.log'}")
    assert len(done) == 3
    assert ticks == [(0, 3), (1, 3), (2, 3), (3, 3)]  # the bar starts at 0 and ends full


def test_the_driver_says_when_it_hands_a_trial_to_a_worker_and_where_its_log_is(tmp_path):
    # With -v (`detail`): by default each trial has its one line when it ends.
    lines: list[str] = []
    executor = _Remote()
    _loop(tmp_path, executor, lines, [], detail=lines).run(n_trials=2, timeout_s=None)
    starts = [ln for ln in lines if "engine starting" in ln]
    assert starts[0] == (f"  trial 0: engine starting for baseline (no speculation) (log: "
                         f"{tmp_path / 'trials' / '0' / 'engine.log'}); its figures come back "
                         "when it ends")
    assert len(starts) == 2
    assert lines.index(starts[1]) > lines.index(next(ln for ln in lines if ln.startswith("[1/")))
    assert executor.options == [{}, {}]  # nothing a worker could not carry


def test_an_inline_trial_reports_its_own_start_and_ready_lines_prefixed_by_its_number(
        tmp_path):
    lines: list[str] = []
    executor = _Inline(sleep_s=0.3)
    search = _loop(tmp_path, executor, lines, [], show_bar=True, detail=lines)
    search.run(n_trials=1, timeout_s=None)
    assert lines[:2] == ["  trial 0: engine starting for trial 0 (log: x)",
                         "  trial 0: engine ready in 3 s"]
    assert lines[2].startswith("[1/1] trial 0 ")
    assert executor.options[0]["show_bar"] is True
    # The wall time covers the whole trial, though an inline executor runs it inside submit.
    trial = search.study.get_trials()[0]
    assert trial.user_attrs[TrialAttr.WALL_S] >= 0.3


@pytest.mark.parametrize("executor", [_Remote, _Inline])
def test_without_v_a_trial_says_one_line_when_it_ends(tmp_path, executor):
    lines: list[str] = []
    _loop(tmp_path, executor(fail={1}), lines, []).run(n_trials=2, timeout_s=None)
    assert [ln.split(" ", 1)[0] for ln in lines] == ["[1/2]", "[2/2]"]
    assert "FAIL" in lines[1] and "engine.log" in lines[1]  # the log is named where it matters


def test_repeats_extend_the_total_and_keep_counting(tmp_path):
    lines, ticks = [], []
    search = _loop(tmp_path, _Remote(), lines, ticks)
    search.run(n_trials=3, timeout_s=None)
    search.repeat_leaders(repeats=2, leaders=1)  # the baseline and the best config, once each
    marks = [ln.split(" ", 1)[0] for ln in lines if ln.startswith("[")]
    assert marks == ["[1/3]", "[2/3]", "[3/3]", "[4/5]", "[5/5]"]
    assert ticks[-3:] == [(3, 5), (4, 5), (5, 5)]


def test_the_replay_strategy_counts_launches_against_the_launch_budget(tmp_path):
    lines, ticks = [], []
    search = _loop(tmp_path, _Remote(), lines, ticks)
    replay = replay_strategy.ReplaySearch(study_dir=tmp_path, limits=EngineLimits(
        max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=2048))
    # No token ids came back with the baseline: one launch, then the Optuna fallback.
    stop = search.run(replay, n_trials=5, timeout_s=None)
    assert stop.reason == strategy.StopReason.NO_TOKENS and stop.ranking is None
    first = [ln for ln in lines if ln.startswith("[")]
    assert len(first) == 1 and first[0].startswith("[1/5] trial ")
    assert " baseline (no speculation): " in first[0]
    assert ticks == [(0, 5), (1, 5)]


def test_without_a_bar_lines_go_straight_to_say(capsys):
    said: list[str] = []
    progress = console.TrialProgress(say=said.append, show_bar=False)
    progress.update(0, 3)
    progress.say("[1/3] trial 0 ...")
    progress.update(1, 3)
    progress.close()
    assert said == ["[1/3] trial 0 ..."]
    assert progress.bar is None and capsys.readouterr().err == ""


def test_the_bar_shows_done_of_total_and_lines_print_above_it(capsys):
    import sys

    progress = console.TrialProgress(say=lambda m: print(m, file=sys.stderr), show_bar=True,
                                     refresh_s=0.05)
    progress.update(1, 4)  # a resumed study: one trial was done before this run
    progress.say("[2/4] trial 1 ngram k=2 window 2-3: ...")
    progress.update(2, 4)
    time.sleep(0.2)  # the ticker redraws between trials
    progress.close()
    err = capsys.readouterr().err
    assert "\n[2/4] trial 1 ngram k=2 window 2-3: ...\n" in err.replace("\r", "\n")
    assert "1/4 [" in err and "2/4 [" in err and "trials:" in err
    assert progress.bar is None


@pytest.mark.parametrize(("quiet", "disable", "tty", "want"), [
    (False, False, True, True), (True, False, True, False), (False, True, True, False),
    (False, False, False, False)])
def test_the_cli_shows_bars_on_a_terminal_unless_quiet_or_disabled(monkeypatch, quiet, disable,
                                                                   tty, want):
    import argparse
    import sys

    from tuner import cli

    monkeypatch.setattr(sys.stderr, "isatty", lambda: tty)
    args = argparse.Namespace(quiet=quiet, disable_tqdm=disable)
    assert cli.arguments.show_bar(args) is want

"""The replay strategy's confirm launches (tuner/search/replay_confirm.py, tuner/search/ranking.py
`_verdict`, `_confirm`): when speedup intervals decide the ranking, on synthetic launches,
and the ranking in words (tuner/outputs/ranking.py).

No engine and no storage: each config's throughputs at the target level stand in for the
study's launches, and a launch appends the next scripted figure."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from tuner import intervals
from tuner.outputs import decision_words, decisions, ranking
from tuner.outputs.ranking import full, short
from tuner.records.configs import EngineLimits, TrialConfig
from tuner.search.replay_strategy import ReplaySearch
from tuner.search.strategy import Stop, StopReason

BASE = TrialConfig()
ALIGNED = TrialConfig(engine_args={"no_async_scheduling": True})


def ngram(k: int, lo: int = 4, hi: int = 4) -> TrialConfig:
    return TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens": k,
                                           "prompt_lookup_min": lo, "prompt_lookup_max": hi})


A, B = ngram(3), ngram(5, 2, 5)


class _View:
    """What ReplaySearch reads of its StudyView while it confirms."""

    def __init__(self) -> None:
        self.study, self.target, self.n_trials = None, 1, 0
        self.said: list[str] = []
        self.details: list[str] = []
        self.notes: list[tuple[str, str]] = []
        self.say, self.detail = self.said.append, self.details.append
        self.space = SimpleNamespace(baseline=TrialConfig)

    def note(self, topic: str, text: str, key: str | None = None) -> None:
        self.notes.append((topic, text))

    def record(self, event, *, store: bool = True, show: bool = True) -> None:
        """The loop's events (tuner.records.decisions): their lines said, decisions kept."""
        decisions.Narrator(None, say=self.say, detail=self.detail)(event, show=show)
        if store and event.topic is not None:
            self.notes.append((event.topic, decision_words.text(event)))


def _search(runs: list[tuple[TrialConfig, list[float]]], *, aligned: bool = False,
            **options: float) -> ReplaySearch:
    search = ReplaySearch(study_dir=Path("."), limits=EngineLimits(
        max_model_len=4096, max_num_seqs=8, max_num_batched_tokens=2048), **options)
    search.view = _View()  # the loop hands it one with each ask
    search.runs = {cfg.key(): list(values) for cfg, values in runs}  # launches by config key
    search._throughputs = lambda: {k: list(v) for k, v in search.runs.items() if v}
    search.windows = {}  # config key -> [(prompts digest, windows)] per launch
    search._launch_windows = lambda: search.windows
    search._baselines = lambda: [BASE, *([ALIGNED] if aligned else [])]
    search.launches = lambda: 0  # no study: the budget (n_trials, 0 here) is all that is left
    return search


def _run(flow) -> Stop:
    """Drive a phase as the loop does: each launch it yields is told back as completed (the
    test's own `_launch` appended the launch's figure), until it stops."""
    try:
        step = next(flow)
        while True:
            step = flow.send(step)
    except StopIteration as end:
        return end.value


def _said(stop: Stop, search: ReplaySearch) -> None:
    """The ranking said as tuner.api says it, through the loop's lines."""
    loop = search.view
    ranking.say_ranking(stop.ranking, say=loop.say, detail=loop.detail, note=loop.note)


def test_a_clear_winner_is_decided_with_its_interval():
    search = _search([(BASE, [100, 102, 98]), (A, [121, 119, 123]), (B, [110, 112, 108])])
    verdict = search._verdict([A, B])
    assert verdict.decided
    assert verdict.best.label == verdict.first.label == A.label()
    assert [(c.a, c.b, c.decision) for c in verdict.pairs] == [
        (A.label(), BASE.label(), "above"), (A.label(), B.label(), "above")]
    assert [s.label for s in verdict.over_plain] == [A.label(), B.label()]
    assert verdict.path is None and verdict.gains == ()
    # df 6 (three configs, three launches each): t = 2.447.
    logs = {k: [math.log(x) for x in v] for k, v in search.runs.items()}
    sd = math.sqrt(sum(statistics.variance(v) * 2 for v in logs.values()) / 6)
    diff = statistics.mean(logs[A.key()]) - statistics.mean(logs[BASE.key()])
    lo, hi = (math.exp(diff + s * 2.447 * sd * math.sqrt(2 / 3)) for s in (-1, 1))
    assert short(verdict) == (f"decided at c=1: first ngram k=3 window 4-4 1.21x (95% interval "
                             f"{lo:.2f}-{hi:.2f}; 3 and 3 launches)")
    assert "ngram k=3 window 4-4 beats baseline (no speculation)" in full(verdict)
    assert "ngram k=3 window 4-4 beats ngram k=5 window 2-5: 1.10x" in full(verdict)
    assert "pooled over 3 config(s) (6 degrees of freedom)" in full(verdict)


def test_a_speedup_that_moves_across_the_levels_windows_is_not_decided_by_launches_alone():
    runs = [(BASE, [100, 102, 98]), (A, [121, 119, 123]), (B, [110, 112, 108])]
    assert _search(runs)._verdict([A, B]).decided
    # The same launches, but A's gain over the baseline lives in one window of the three
    # (the same requests in every launch): 1.6x, 1.0x, 1.0x. Across prompts it is not sure.
    search = _search(runs)
    search.windows = {BASE.key(): [("d", (100.0, 100.0, 100.0))] * 3,
                      A.key(): [("d", (160.0, 100.0, 105.0))] * 3,
                      B.key(): [("d", (110.0, 110.0, 110.0))] * 3}
    verdict = search._verdict([A, B])
    assert not verdict.decided and "open" in short(verdict)


def test_overlapping_launches_leave_it_open_and_say_which_comparison():
    search = _search([(BASE, [100, 110]), (A, [108, 103]), (B, [90, 92])])
    verdict = search._verdict([A, B])
    assert not verdict.decided
    assert short(verdict).startswith("undecided at c=1: ngram k=3 window 4-4 against baseline "
                                    "(no speculation) is open: 1.01x (95% interval 0.")
    assert short(verdict).count("is open") == 1  # one comparison: A is also the runner-up's
    assert full(verdict).startswith("undecided at c=1: ")
    assert "ngram k=3 window 4-4 beats" not in full(verdict)


def test_within_the_margin_either_will_do():
    search = _search([(BASE, [100.0, 100.2, 99.8]), (A, [100.1, 100.3, 99.9]),
                      (B, [90.0, 90.5, 89.5])])
    verdict = search._verdict([A, B])
    assert verdict.decided
    assert short(verdict).startswith("decided at c=1: first ngram k=3 window 4-4 1.00x")
    assert short(verdict).endswith("; ngram k=3 window 4-4 and baseline (no speculation) within "
                                  "\u00b12%: either will do")
    # With no margin the same launches cannot tell the two apart.
    assert not _search([(BASE, [100.0, 100.2, 99.8]), (A, [100.1, 100.3, 99.9]),
                        (B, [90.0, 90.5, 89.5])], margin=0.0)._verdict([A, B]).decided


def test_the_baseline_can_win():
    search = _search([(BASE, [100, 101, 99]), (A, [80, 81, 79]), (B, [85, 86, 84])])
    verdict = search._verdict([A, B])
    assert verdict.decided
    assert short(verdict).startswith("decided at c=1: first baseline (no speculation); best "
                                    "speculative ngram k=5 window 2-5 0.85x (95% interval 0.")


def test_one_launch_is_enough_once_the_others_pool_two_degrees_of_freedom():
    few = _search([(BASE, [100, 101]), (A, [130]), (B, [120])])
    verdict = few._verdict([A, B])
    assert not verdict.decided and not full(verdict)
    assert verdict.status == intervals.RankingStatus.FEW_LAUNCHES
    assert (verdict.short_of, verdict.launches) == (A.label(), 1)
    assert short(verdict).startswith("undecided at c=1: ngram k=3 window 4-4 has 1 launch(es)")
    pooled = _search([(BASE, [100, 101, 99]), (A, [130]), (B, [120, 121, 119])])
    verdict = pooled._verdict([A, B])
    assert verdict.decided and "1.30x (95% interval" in short(verdict)
    assert "; 1 and 3 launches)" in short(verdict)


def test_a_higher_confidence_needs_more_launches():
    runs = [(BASE, [100, 104]), (A, [110, 106]), (B, [90, 93])]
    assert _search(runs, confidence=0.8)._verdict([A, B]).decided
    verdict = _search(runs, confidence=0.99)._verdict([A, B])
    assert not verdict.decided and "99% interval" in short(verdict)


def test_with_an_aligned_baseline_the_split_is_in_the_full_verdict_only():
    search = _search([(BASE, [100, 101, 99]), (ALIGNED, [84, 85, 83]), (A, [110, 111, 109]),
                      (B, [95, 96, 94])], aligned=True)
    verdict = search._verdict([A, B])
    assert verdict.decided and "speculation alone" not in short(verdict)
    assert verdict.path.label == ALIGNED.label() and verdict.path.interval.point < 1
    assert [g.label for g in verdict.gains] == [A.label(), B.label()]
    assert "engine path 0.84x (95% interval" in full(verdict)
    assert "speculation alone (over the aligned baseline): ngram k=3 window 4-4 1.31x" \
        in full(verdict)


@pytest.mark.parametrize("n_trials", [3, 12])
def test_confirm_launches_least_measured_first_until_decided(n_trials):
    search = _search([(BASE, [100]), (A, [120]), (B, [110])])
    script = {BASE.key(): [101, 99, 100], A.key(): [121, 119, 120], B.key(): [111, 109, 110]}
    launched: list[str] = []

    def launch(cfg: TrialConfig, role: object) -> object:
        launched.append(cfg.label())
        search.runs[cfg.key()].append(script[cfg.key()].pop(0))
        return cfg

    search._launch, search._align, search._predict = launch, lambda: iter(()), lambda _c: None
    search._room = lambda: len(launched) < n_trials
    search.view.n_trials = n_trials  # looks at the ranking: n_trials + 1, each at 5% / looks
    stop = _run(search._confirm([A, B], capture=None))
    assert stop.ranking is not None and stop.ranking.decided
    assert stop.reason == StopReason.DECIDED
    _said(stop, search)
    # The baseline first on ties, then the first leader; with 3 launches allowed, decided
    # there: the pool then holds two degrees of freedom, so the other leader's one launch has
    # an interval. With 12 allowed, each look is taken at 5% / 13 and needs the third launch.
    assert launched == ["baseline (no speculation)", "ngram k=3 window 4-4",
                        "ngram k=5 window 2-5"][:2 if n_trials == 3 else 3]
    said = [ln for ln in search.view.said if ln.startswith("Ranking")]
    assert said == [said[-1]] and said[0].startswith("Ranking decided at c=1: first ngram k=3")
    assert said[0].endswith("; every figure: -v or the report.")
    assert search.view.details[-1].startswith("Ranking decided at c=1: ngram k=3 window 4-4 "
                                              "beats baseline (no speculation)")
    assert search.view.notes[-1][0] == "confirmation"


def test_confirm_says_what_is_open_when_the_budget_ends():
    search = _search([(BASE, [100]), (A, [104]), (B, [90])])
    noisy = {BASE.key(): [112], A.key(): [99], B.key(): [91]}

    def launch(cfg: TrialConfig, role: object) -> object:
        search.runs[cfg.key()].append(noisy[cfg.key()].pop(0))
        return cfg

    search._launch, search._align, search._predict = launch, lambda: iter(()), lambda _c: None
    budget = iter([True, True, True, False])
    search._room = lambda: next(budget)
    stop = _run(search._confirm([A, B], capture=None))
    assert stop.reason == StopReason.BUDGET
    assert stop.ranking.status == intervals.RankingStatus.OPEN
    _said(stop, search)
    assert search.view.said[-1].startswith("Ranking undecided at c=1: ngram k=3 window 4-4 "
                                           "against baseline (no speculation) is open")


def test_each_look_takes_its_share_of_the_error_so_more_looks_decide_later():
    runs = [(BASE, [100, 102]), (A, [104, 106]), (B, [90, 91])]
    once = _search(runs)
    once._looks = 1
    many = _search(runs)
    many._looks = 20
    assert once._verdict([A, B]).decided
    wide = many._verdict([A, B])
    assert not wide.decided and "99.75% interval" in short(wide)

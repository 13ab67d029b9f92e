"""Search stage, the replay strategy: predict the whole space, launch only to confirm.

    baseline launch (its tokens captured, and the workload sample's: RequestSchedule.sample)
    -> replay every candidate of the space over those tokens (tuner.replay) -> one
    calibration launch (the candidate that drafts the most per step, so the step-cost line
    spans the space; on an engine that splits CUDA graphs by batch shape, a second one whose
    steps are least often uniform, tuner.replay.cost) -> each level decided on the forecast
    over the workload sample (tuner.replay.forecast, tuner.replay.selection), its chosen
    config launched to confirm the step cost, the chosen config and the baseline in turn only
    where more launches would decide a level, until every level is decided or --n-trials or
    --timeout runs out.

Without a workload sample (--sample-prompts 0, a study stored before it), the predicted
leaders are confirmed instead, interleaved with the baseline and repeated until speedup
intervals decide the ranking (tuner.intervals, at --confidence, within --margin).

Where the calibration launch left the plain baseline's engine path, the aligned baseline
(tuner.search.loop SearchLoop.align) is launched next, anchors the step-cost line, and is
repeated beside the plain one, so each leader's ratio splits into path cost x speculation gain.

Every launch is an ordinary trial of the study (roles baseline, calibration, confirm,
repeat), so reports and a later `--strategy optuna` resume read them as always; each level's
selection is stored with the study (tuner.search.study.store_selections), and the answer
rests on it. --n-trials is the number of engine launches. The strategy never launches: the
loop does (tuner.search.strategy); the selections, or the ranking the confirm launches
reach, come back as figures in the Stop (tuner.outputs words them).
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from optuna.trial import FrozenTrial, TrialState

from tuner import intervals
from tuner.errors import ConfigError
from tuner.measure import enginepath
from tuner.records.configs import EngineLimits, TrialConfig
from tuner.records.policy import LadderRun
from tuner.records.predictions import PredictedRow
from tuner.records.results import BenchResult, LevelMetrics, Role
from tuner.records.selection import Choice, Selection, ThroughputCheck, Undecided
from tuner.records.storage import TrialAttr
from tuner.replay import acceptance, forecast, sampling, selection
from tuner.replay.predict import MeasuredTrial, Prediction, misses, predict, yardsticks
from tuner.search import noise_profile
from tuner.search import study as st
from tuner.search.loop import SearchLoop, aligned_config
from tuner.search.space import Param, Point, SearchSpace, Value
from tuner.search.strategy import Launch, Step, Stop, StopReason
from tuner.tokens import TokenCapture

# A phase of the strategy as it runs: yields the launches it needs, is sent each one's trial
# (None: it failed), returns what it found.
T = TypeVar("T")
Flow = Generator[Launch, FrozenTrial | None, T]

GRID_LIMIT = 4000  # n-gram's whole default space is 160 points
SAMPLED_POINTS = 48  # per method whose space is continuous or larger than GRID_LIMIT
# A suffix replay steps arctic-inference's cache from Python, about 11 us per output token
# (0.33 s per config over the 29k tokens of an H200 capture): 24 sampled points, then `refine`.
SUFFIX_POINTS = 24


def why_not_replayable(space: SearchSpace, *, rates: list[float] | None) -> str | None:
    """None when every candidate of `space` can be predicted by replay, else why not."""
    other = [m for m in space.speculative_methods() if m not in acceptance.REPLAYABLE]
    if other:
        return (f"method(s) {', '.join(other)} cannot be replayed (only "
                f"{', '.join(acceptance.REPLAYABLE)} can)")
    if any(isinstance(p, Param) for p in space.engine.values()):
        return "the space searches engine knobs, which the step-cost model does not cover"
    if rates:
        return "--acceptance-profile forces a synthetic acceptance that replay cannot predict"
    return None


def candidates(space: SearchSpace, *, seed: int = 0) -> list[TrialConfig]:
    """The configs to replay: every grid point of a method (n-gram: all 160), or a seeded
    sample where the method's grid is large or continuous, the space's start points always.
    A sampled grid is then searched around the predicted leaders (`refine`)."""
    rng = random.Random(seed)
    out: dict[str, TrialConfig] = {}
    for point in space.start_points:
        params = space.params_of(point)
        if params:
            cfg = space.config_from_params(params)
            out[cfg.key()] = cfg
    for method in space.speculative_methods():
        cap = SUFFIX_POINTS if method == "suffix" else GRID_LIMIT
        sub = only_method(space, method)
        points = grid_points(sub)
        if points is not None and len(points) <= cap:
            configs = [sub.config_from_params(p) for p in points]
        elif points is not None:  # a grid too large to replay whole: a sample of its points
            configs = [sub.config_from_params(p) for p in rng.sample(points, cap)]
        else:
            configs = [sub.suggest(_RandomTrial(rng)) for _ in range(
                min(cap, SAMPLED_POINTS) * 4)]
            rng.shuffle(configs)
        picked = 0
        for cfg in configs:
            if cfg.key() not in out and picked < cap:
                out[cfg.key()] = cfg
                picked += 1
    return list(out.values())


def neighbours(space: SearchSpace, configs: Iterable[TrialConfig]) -> list[TrialConfig]:
    """The grid points one step from `configs`: one knob moved to the next or the previous
    value of its domain, the others kept (methods whose grid cannot be enumerated have none)."""
    out: dict[str, TrialConfig] = {}
    grids: dict[str, _Grid | None] = {}
    for cfg in configs:
        method = cfg.method
        if method not in space.methods or method == "none":
            continue
        if method not in grids:
            grids[method] = _Grid.of(only_method(space, method))
        grid = grids[method]
        point = space.point_of(cfg)
        if grid is None or point is None or point not in grid.points:
            continue
        for name, domain in grid.domains.items():
            at = domain.index(point.value(name))
            for j in (at - 1, at + 1):
                if 0 <= j < len(domain):
                    moved = grid.points.get(point.with_value(name, domain[j]))
                    if moved is not None:
                        near = space.config_from_params(moved)
                        out.setdefault(near.key(), near)
    return list(out.values())


@dataclass(frozen=True)
class _Grid:
    """A method's grid: each point by itself (a point moved to a value equal to the grid's,
    3.0 for 3, is the grid's own point), and the sorted values of each searched key."""

    points: dict[Point, Point]
    domains: dict[str, list[Value]]

    @classmethod
    def of(cls, space: SearchSpace) -> _Grid | None:
        """The grid of a one-method space; None where it cannot be enumerated."""
        points = grid_points(space)
        if points is None:
            return None
        (method, block), = space.methods.items()
        return cls(points={p: p for p in points},
                   domains={name: sorted({p.value(name) for p in points})
                            for name, param in block.items() if isinstance(param, Param)})


REFINE_ROUNDS = 6  # hill-climbing rounds around the leaders; each replays a few dozen configs
REFINE_TOP = 2  # leaders per method and level whose neighbours are replayed
REFINE_MAX = 64  # configs the climb may add
# ... and at most this many captured output tokens replayed: a suffix replay costs ~11 us per
# token, twice where a config follows the calibration's token stream (tuner.replay.streams), so
# on an H200-size capture (29k tokens) the climb adds 20 configs, ~20 s; on the README's main
# job (1.3k tokens) REFINE_MAX.
REFINE_TOKENS = 600_000


def refine_limit(capture: TokenCapture) -> int:
    """How many configs the climb may add over `capture` (REFINE_MAX, fewer on large ones)."""
    tokens = sum(len(r.output) for r in capture.requests)
    return max(1, min(REFINE_MAX, REFINE_TOKENS // max(1, tokens)))


def refine(space: SearchSpace, configs: list[TrialConfig], pred: Prediction,
           predict_more: Callable[[list[TrialConfig]], Prediction], *, limit: int = REFINE_MAX
           ) -> tuple[list[TrialConfig], Prediction, int]:
    """Search the sampled grids (suffix: 24 of 1,536 points) around the predicted leaders:
    predict the grid neighbours of the REFINE_TOP best configs of each method at every level
    (`predict_more` predicts the configs it is given, from the same capture and trials), add
    them to the table, and repeat until no leader has an unpredicted neighbour (or
    REFINE_ROUNDS, or `limit` configs added: `refine_limit`). Needs a calibrated step cost (the
    leaders are by predicted throughput). Returns the configs, the table and how many configs it added.

    On the stored CPU sets the predicted suffix landscape is flat near its top: over two sets
    and three seeds the sample's best came within 1.5% of the whole grid's, the climb's within
    0.3%, after 37-64 more replays (3-7 s) against 85-96 s for the grid
    (benchmarks/suffix_sample.py). The climb is there for workloads whose top is not flat."""
    added = 0
    by_key = {c.key(): c for c in configs}  # the rows of `pred` are of these configs
    for _ in range(REFINE_ROUNDS):
        if not any(c.calibrated for c in pred.costs.values()):
            break
        # a drafter's K axis (tuner.replay.drafter_k) has rows of K the configs may not hold
        leaders = [by_key[r.key] for r in _leading_rows(pred) if r.key in by_key]
        fresh = [c for c in neighbours(space, leaders) if c.key() not in by_key]
        fresh = fresh[:limit - added]
        if not fresh:
            break
        by_key.update((c.key(), c) for c in fresh)
        configs = [*configs, *fresh]
        added += len(fresh)
        pred = pred.extended(predict_more(fresh))
    return configs, pred, added


def _leading_rows(pred: Prediction) -> list[PredictedRow]:
    """The REFINE_TOP best predicted rows of each method at every level."""
    leaders = []
    for level in sorted(pred.costs):
        ranked = pred.leaders(level, 10_000)
        for method in dict.fromkeys(r.method for r in ranked):  # best method first
            leaders += [r for r in ranked if r.method == method][:REFINE_TOP]
    return leaders


def only_method(space: SearchSpace, method: str) -> SearchSpace:
    return space.model_copy(update={"methods": {method: space.methods[method]}})


def grid_points(space: SearchSpace) -> list[Point] | None:
    """Every grid point, or None where the grid is continuous or larger than GRID_LIMIT."""
    try:
        return space.grid(limit=GRID_LIMIT)
    except ConfigError:
        return None


class _RandomTrial:
    """Just enough of an Optuna trial for SearchSpace.suggest to draw one random point."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def suggest_categorical(self, _name: str, choices: list[Any]) -> Any:
        return self.rng.choice(choices)

    def suggest_int(self, _name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        return low + step * self.rng.randint(0, (high - low) // step)

    def suggest_float(self, _name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        if step:
            return round(low + step * self.rng.randint(0, int(round((high - low) / step))), 10)
        return self.rng.uniform(low, high)


class Phase(str, Enum):
    """Where the replay strategy stands (ReplaySearch.phase)."""

    BASELINE = "baseline"  # the plain baseline, launched where the study has none
    REPLAY = "replay"  # every candidate predicted over the baseline's tokens
    CALIBRATE = "calibrate"  # the launches that fit the step cost
    CLIMB = "climb"  # the sampled grids searched around the predicted leaders
    CONFIRM = "confirm"  # the baselines and the leaders launched in turn until ranked
    STOPPED = "stopped"  # the Stop handed to the loop says why


def _ignore(_shown: object) -> None:
    return None


@dataclass(frozen=True)
class Watch:
    """Who is shown what the strategy finds as it goes: each new prediction (the study's
    predicted.csv), each level's selection (the lines a person reads)."""

    prediction: Callable[[Prediction], None] = _ignore
    selection: Callable[[tuple[Selection, ...]], None] = _ignore


class ReplaySearch:
    """The replay strategy (tuner.search.strategy Strategy) over one SearchLoop, which
    launches its picks: the phases run in order, each launch handed to the loop as a Launch
    and its outcome told back before the strategy goes on (`sequential`); --n-trials counts
    every engine launch, repeats included."""

    sequential = True
    counts_repeats = True

    def __init__(self, loop: SearchLoop, *, study_dir: Path, limits: EngineLimits,
                 leaders: int = 2, seed: int = 0, watch: Watch | None = None,
                 confidence: float = intervals.CONFIDENCE,
                 margin: float = intervals.MARGIN) -> None:
        self.loop, self.study, self.study_dir = loop, loop.study, study_dir
        self.limits, self.leaders, self.seed = limits, leaders, seed
        # The confirm launches end when speedup intervals at this confidence decide the
        # ranking; within `margin` of 1.00x two configs are as good as each other.
        self.confidence, self.margin = confidence, margin
        watch = watch or Watch()
        self.on_prediction, self.on_selection = watch.prediction, watch.selection
        self._sample_memo: dict = {}  # the sample's replays (tuner.replay.forecast)
        self._failed: set[str] = set()  # config keys whose launch failed: never a subject
        self._looks = 1  # how many times _confirm may look at the ranking (set there)
        self._paired: dict[str, list[intervals.LaunchWindows]] = {}  # _verdict: windows by key
        self.say, self.detail, self.note = loop.say, loop.detail, loop.note
        self.prediction: Prediction | None = None
        self._memo: dict = {}  # replays survive re-predictions (acceptance never changes)
        self._configs: dict[str, TrialConfig] = {}  # the configs replayed, by key
        self.phase = Phase.BASELINE
        self._flow: Flow[Stop] | None = None  # the phases, started by the first ask
        self._told: FrozenTrial | None = None  # the last launch's outcome, for the flow
        self._stop: Stop | None = None
        self._ran_out: StopReason | None = None  # the budget's end, said once (_room)

    # -- the strategy -----------------------------------------------------------------------
    def ask(self) -> Step:
        """The next launch of the phases, or how they ended (NO_TOKENS: the Optuna search
        takes over)."""
        if self._stop is not None:
            return self._stop
        if self._flow is None:
            self._flow = self._phases()
        try:
            return self._flow.send(self._told)
        except StopIteration as end:
            self.phase, self._stop = Phase.STOPPED, end.value
            return end.value

    def tell(self, launch: Launch, trial: FrozenTrial | None) -> None:
        self._told = trial

    def _phases(self) -> Flow[Stop]:
        """Baseline, replay (calibrating and climbing), confirm: each `yield` a launch, and
        the trial it completed as (None: it failed) sent back."""
        base = yield from self._baseline()
        if base is None:
            return Stop(StopReason.NO_BASELINE)  # failure_summary tells the user why
        yield from self._align()  # a given aligned baseline; "auto" on a resumed study
        capture = st.token_capture(self.study_dir, base)
        if capture is None:
            text = ("The baseline trial holds no token ids (this vLLM did not return them), "
                    "so replay cannot predict; using the Optuna search instead.")
            self.say(text)
            self.note("strategy", text)
            return Stop(StopReason.NO_TOKENS)
        pred = yield from self._replay_space(capture)
        sample = forecast.sample_capture(st.token_capture(self.study_dir, base, sample=True)
                                         or capture)
        if sample is not None:  # the workload sample decides; launches confirm
            return (yield from self._select(capture, sample, pred))
        leaders = self._pick_leaders(pred)
        if not leaders:
            return Stop(StopReason.NO_LEADER)
        return (yield from self._confirm(leaders, capture))

    def _room(self) -> bool:
        """Whether --n-trials and --timeout leave room for another launch (SearchLoop.room;
        why not, said once)."""
        room = self.loop.room()
        if room is not None and self._ran_out is None:
            self._ran_out = room
            why = (f"--timeout {self.loop.timeout_s:.0f} s reached; stopping."
                   if room == StopReason.TIMEOUT else f"--n-trials {self.loop.n_trials}: "
                   "every engine launch of the budget is spent.")
            self.say(why)
            self.note("stop", why)
        return room is None

    def _baseline(self) -> Flow[Any]:
        """The study's plain baseline, launched where it has none yet; None where the budget
        is spent or the launch failed."""
        self.phase = Phase.BASELINE
        base = self._first(st.is_baseline)
        if base is None and self._room():
            base = yield self._launch(self.loop.space.baseline(), Role.BASELINE)
            if base is not None:
                self._say_expected_time(base)
        return base

    def _say_expected_time(self, base: Any) -> None:
        """Every launch sends the same requests, so the baseline's launch says what the others
        cost: said once, with the launches the budget leaves."""
        wall = base.user_attrs.get(TrialAttr.WALL_S)
        left = self.loop.n_trials - self.launches()
        if not wall or left <= 0:
            return
        text = (f"Each launch sends the same {self.loop.requests_per_launch()} requests; the "
                f"baseline's took {wall:.0f} s, so the {left} launch(es) left take about "
                f"{left * wall / 60:.1f} min (speculative ones as much faster or slower as they "
                f"decode).")
        self.say(text)
        self.note("strategy", text, "expected time")

    def _replay_space(self, capture: TokenCapture) -> Flow[Prediction]:
        """Predict the space over the baseline's tokens, with the calibration launches the
        step cost needs and the climb around the predicted leaders."""
        self.phase = Phase.REPLAY
        configs = candidates(self.loop.space, seed=self.seed)
        self._configs = {c.key(): c for c in configs}
        self.say(f"Replaying {len(configs)} configs of space '{self.loop.space.name}' over the "
                 "baseline's tokens (no engine) ...")
        pred = self._predict(capture)
        text = (f"Replayed {pred.configs} configs of space '{self.loop.space.name}' over the "
                f"baseline's {len(capture.level(capture.levels()[0], warmup=False))} requests "
                f"per level in {pred.seconds:.1f} s (no engine).")
        self.detail(text)
        self.note("replay", text)
        self.phase = Phase.CALIBRATE
        pred = yield from self._calibrate(capture, pred)
        pred = yield from self._calibrate_mixed(capture, pred)
        self.phase = Phase.CLIMB
        pred = self._climb(capture, pred)
        self._print_costs(pred)
        return pred

    def _calibrate(self, capture: TokenCapture, pred: Prediction) -> Flow[Prediction]:
        """Launch the candidate that drafts the most per step, so the step-cost line spans
        the space, where no launch has calibrated it yet."""
        if any(c.calibrated for c in pred.costs.values()) or not self._room():
            return pred
        calib = self._calibration_config(pred)
        if calib is None:
            return pred
        text = (f"{calib.label()} drafts the most per step "
                f"({self._drafted(pred, calib):.1f} tokens), so the step-cost line "
                "spans the space.")
        self.say(f"Calibration launch: {text}")
        self.note("calibration", text, "first")
        yield self._launch(calib, Role.CALIBRATION)
        yield from self._align()  # "auto": the calibration is the first speculative trial
        return self._predict(capture)

    def _calibrate_mixed(self, capture: TokenCapture, pred: Prediction) -> Flow[Prediction]:
        """On an engine that splits CUDA graphs by batch shape, launch a second calibration
        whose steps are least often uniform (tuner.replay.cost)."""
        if not any(c.needs_mixed_point for c in pred.costs.values()) or not self._room():
            return pred
        row = self._mixed_calibration_row(pred)
        if row is None:
            return pred
        calib = self._config_of(row)
        self.say(f"Second calibration launch: {calib.label()} (this engine splits "
                 "CUDA graphs by batch shape).")
        text = (f"{calib.label()} drafts a full K on "
                f"{row.uniform_share:.0%} of its steps at c={row.concurrency}: "
                "this engine splits CUDA graphs by batch shape, so the step cost "
                "needs a point where most steps are not uniform.")
        self.detail(f"Second calibration launch: {text}")
        self.note("calibration", f"Then {text}", "second")
        yield self._launch(calib, Role.CALIBRATION)
        return self._predict(capture)

    def _climb(self, capture: TokenCapture, pred: Prediction) -> Prediction:
        """Replay the grid neighbours of the predicted leaders (`refine`)."""
        started = time.monotonic()
        configs, pred, added = refine(self.loop.space, list(self._configs.values()), pred,
                                      lambda more: self._predict(capture, more, show=False),
                                      limit=refine_limit(capture))
        if added:
            self._configs = {c.key(): c for c in configs}
            self._show(pred)
            text = (f"Searched the sampled grids around the predicted leaders: {added} more "
                    f"configs replayed ({len(configs)} in all, "
                    f"{time.monotonic() - started:.1f} s).")
            self.detail(text)
            self.note("climb", text)
        return pred

    def _pick_leaders(self, pred: Prediction) -> list[TrialConfig]:
        """The predicted leaders at the target level to confirm by launches (`_diverse`);
        where the baseline sampled, which of them (and how many more) the replay cannot
        order against the best (sampling.within)."""
        target = self.loop.target
        ranked = pred.leaders(target, 10_000)
        top = _diverse(ranked, self.leaders)
        if not top:
            self.say("No predicted leader to confirm.")
            self.note("leaders", "No predicted leader to confirm.")
            return []
        named = "; ".join(f"{r.label} {r.pred_output_throughput:.1f}{_pm(r)} tok/s "
                          f"({r.pred_speedup:.2f}x)" for r in top)
        self.say(f"Predicted leaders at c={target}: {named}")
        self.note("leaders", f"At c={target}, launched to confirm them: {named}.")
        tied = [r for r in ranked[1:] if sampling.within(r, ranked[0])]
        if tied:
            launched = ", ".join(r.label for r in tied if r in top) or "none"
            text = (f"At temperature {pred.temperature:g}, {len(tied)} configs' 90% throughput "
                    f"intervals overlap the best's ({ranked[0].label}): the replay cannot "
                    f"order them, the confirm launches decide (launched among them: "
                    f"{launched}; --confirm-leaders launches more).")
            self.detail(text)
            self.note("leaders", text, "tied")
        return [self._config_of(r) for r in top]

    def _confirm(self, leaders: list[TrialConfig], capture: TokenCapture) -> Flow[Stop]:
        """Launch the baselines and the leaders in turn until the ranking is decided or the
        budget is spent; the Stop carries the ranking (none where a baseline failed or every
        leader did). The ranking is looked at before every launch, so each look's
        intervals are taken at 1 - (1 - confidence) / looks (Bonferroni over the looks the
        budget allows): the chance of a wrong decision over the whole confirmation stays
        within the stated confidence."""
        self.phase = Phase.CONFIRM
        self._looks = max(1, self.loop.n_trials - self.launches() + 1)
        while self._room():
            verdict = self._verdict(leaders)
            if verdict.decided:
                return Stop(StopReason.DECIDED, ranking=verdict)
            pick = self._next(leaders)
            launched = yield self._launch(pick, None)
            yield from self._align()  # "auto", when no calibration launch came first
            if launched is not None:
                self._predict(capture)
            elif pick not in leaders:
                self._drop(pick, leaders)
                return Stop(StopReason.BASELINE_FAILED)
            elif not self._drop(pick, leaders):
                return Stop(StopReason.NO_LEADER)
        return Stop(self._ran_out or StopReason.BUDGET, ranking=self._verdict(leaders))

    def _select(self, capture: TokenCapture, sample: TokenCapture, pred: Prediction
                ) -> Flow[Stop]:
        """Decide every level on the forecast over the workload sample
        (tuner.replay.selection); launch a level's subject where it was never launched, and
        the subject and the baseline in turn where more launches would decide the level,
        until every level is decided, launches cannot decide what is open, or the budget is
        spent. Configs within the indifference zone of a subject are never launched against
        it."""
        self.phase = Phase.CONFIRM
        plain = self.loop.space.baseline()
        while True:
            selections = self._selections(capture, sample, pred)
            if not selections:
                return Stop(StopReason.NO_LEADER)
            pick = self._next_for(selections, plain)
            if pick is None:
                decided = all(s.choice != Choice.UNDECIDED for s in selections)
                return Stop(StopReason.DECIDED if decided else StopReason.UNDECIDED,
                            selections=selections)
            if not self._room():
                return Stop(self._ran_out or StopReason.BUDGET, selections=selections)
            launched = yield self._launch(pick, None)
            yield from self._align()
            if launched is None and pick.key() == plain.key():
                return Stop(StopReason.BASELINE_FAILED, selections=selections)
            if launched is None:
                self._failed.add(pick.key())
            pred = self._predict(capture)

    def _next_for(self, selections: tuple[Selection, ...], plain: TrialConfig
                  ) -> TrialConfig | None:
        """The launch that can change an answer: a subject never launched (the target level
        first) that is not off; else, where launches would decide an undecided level, the
        least-measured of the baseline and that level's subject; None: nothing to launch."""
        ordered = sorted(selections, key=lambda s: s.concurrency != self.loop.target)
        for s in ordered:
            if not s.launched and s.choice != Choice.OFF:
                return self._configs[s.subject_key]
        open_ = [s for s in ordered if s.choice == Choice.UNDECIDED
                 and s.undecided == Undecided.COST and s.launches_to_decide is not None]
        if not open_:
            # A host whose spread is barely known learns it from a repeat of the baseline,
            # once per study, for the studies that follow (tuner.search.noise_profile).
            target = ordered[0]
            known = target.host.df if target.host is not None else 0
            if known < noise_profile.LEARNED_DF and len(
                    self._throughputs(target.concurrency).get(plain.key(), ())) < 2:
                return plain
            return None
        pool = [plain, self._configs[open_[0].subject_key]]
        counts = self._throughputs(open_[0].concurrency)
        return min(pool, key=lambda cfg: (len(counts.get(cfg.key(), ())), pool.index(cfg)))

    def _selections(self, capture: TokenCapture, sample: TokenCapture, pred: Prediction
                    ) -> tuple[Selection, ...]:
        """Every level's Selection on the current step cost, stored with the study and shown
        (on_selection); the host's noise profile updated with this study's repeats."""
        configs = [c for c in self._configs.values() if c.key() not in self._failed]
        ratios = {c: y.path_ratio for c, y in yardsticks(
            capture, self.measured(), pred.costs, max_num_seqs=self.limits.max_num_seqs).items()
            if y.path_ratio}
        fc = forecast.forecast(sample, configs, pred.costs, limits=self.limits,
                               ngram_path=pred.ngram_path, path_ratio=ratios,
                               memo=self._sample_memo, seed=self.seed)
        if fc is None:
            return ()
        settings = st.settings_of(self.study)
        machine, me = noise_profile.machine_key(settings), str(self.study_dir.resolve())
        plain_key = self.loop.space.baseline().key()
        out = []
        for c, level in fc.levels.items():
            runs = self._throughputs(c)
            pool = intervals.Pool.of(runs.values())
            noise_profile.record(machine, c, study=me, pool=pool)
            host = noise_profile.host_noise(machine, c, study=me, pool=pool)
            checks = _checks(pred, c, selection.accuracy(host, self.confidence),
                             base_launches=len(runs.get(plain_key, ())))
            measured = {k: iv for k, v in runs.items() if k != plain_key and (
                iv := intervals.speedup(v, runs.get(plain_key, ()), pool=pool,
                                        confidence=self.confidence)) is not None}
            sel = selection.select(level, fc.counts, host=host,
                confidence=self.confidence, indifference=self.margin, checks=checks,
                measured=measured, launched=set(runs))
            if sel is not None:
                out.append(sel.model_copy(update={
                    "subject_config": self._configs.get(sel.subject_key)}))
        st.store_selections(self.study, out)
        self.on_selection(tuple(out))
        return tuple(out)

    def _drop(self, pick: TrialConfig, leaders: list[TrialConfig]) -> bool:
        """A failed launch is recorded as a FAIL trial; launching the same config again would
        spend the budget on it, so it leaves the ranking. False when the confirmation ends
        there (a baseline failed, or no leader is left)."""
        if pick not in leaders:
            text = f"{pick.label()} failed to re-measure; stopping the confirmation."
            self.say(text)
            self.note("confirmation", text, f"failed {pick.key()}")
            return False
        leaders.remove(pick)
        text = f"{pick.label()} failed; it leaves the confirmation."
        self.say(text)
        self.note("confirmation", text, f"failed {pick.key()}")
        return bool(leaders)

    # -- launching --------------------------------------------------------------------------
    def launches(self) -> int:
        """Engine launches in this study so far (repeats included; answers from storage and
        trials a dead driver left behind are not)."""
        return st.counted_trials(self.study, repeats=True)

    def _launch(self, config: TrialConfig, role: Role | None) -> Launch:
        """`config` to measure once as a trial of the study; `role` None: a confirm launch,
        a repeat where the config was measured before."""
        first = self._first(lambda t: t.user_attrs.get(TrialAttr.CONFIG_KEY) == config.key())
        if role is None:
            role = Role.REPEAT if first is not None else Role.CONFIRM
        return Launch(config, role, repeat_of=first.number if role == Role.REPEAT else None)

    def _align(self) -> Flow[None]:
        """Launch the aligned baseline when the loop says it is due (SearchLoop.align: once
        per study). It anchors the step-cost line on the speculative engine path, so the
        predictions carry the path's cost (tuner.replay.cost)."""
        if self._room() and (config := self.loop.align()) is not None:
            yield self._launch(config, Role.ALIGNED_BASELINE)

    def _first(self, match: Callable[[Any], bool]) -> Any:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get(TrialAttr.ROLE) != Role.REPEAT and match(t):
                return t
        return None

    # -- predicting -------------------------------------------------------------------------
    def measured(self) -> list[MeasuredTrial]:
        return measured_trials(self.study, self.study_dir)

    def _predict(self, capture: TokenCapture, configs: list[TrialConfig] | None = None, *,
                 show: bool = True) -> Prediction:
        """Predict `configs` (default: every config replayed so far) from the measured trials."""
        configs = list(self._configs.values()) if configs is None else configs
        pred = predict(capture, configs, self.measured(), max_model_len=self.limits.max_model_len,
                       max_num_seqs=self.limits.max_num_seqs, memo=self._memo,
                       temperature=self.loop.workload.spec.temperature)
        if show:
            self._show(pred)
        return pred

    def _show(self, pred: Prediction) -> None:
        """The table the study keeps (predicted.csv, plots, report), and the step cost and
        token streams it was priced with (the report's "How it was decided")."""
        self.prediction = pred
        self.on_prediction(pred)
        for c in sorted(pred.costs):
            self.note("step_cost", pred.costs[c].describe(), f"c={c}")
        if pred.streams:
            self.note("streams", pred.streams)
        self._check_sampling(pred)
        self._check_predictions(pred)

    def _check_predictions(self, pred: Prediction) -> None:
        """A launched config whose measured acceptance the replay missed beyond its stated
        accuracy (tuner.replay.predict.misses): one line when first found, a note, and the
        record kept in the study's settings (StudySettings.prediction_misses), where the
        recommendation that rests on that config reads it."""
        stored = st.settings_of(self.study)
        known = list(stored.prediction_misses)
        seen = {(m.key, m.concurrency) for m in known}
        fresh = [m for m in misses(pred.rows, temperature=pred.temperature)
                 if (m.key, m.concurrency) not in seen]
        if not fresh:
            return
        for m in fresh:
            self.say(m.text())
            self.note("prediction_miss", m.text(), f"c={m.concurrency}")
        st.store_settings(self.study, stored.model_copy(
            update={"prediction_misses": (*known, *fresh)}))

    def _check_sampling(self, pred: Prediction) -> None:
        """At temperature > 0, a launch whose measured acceptance lies outside the replay's
        interval (sampling.mismatch): said once, noted, and kept per level in the study's
        settings (StudySettings.sampling_mismatch), where the recommendation's reason reads it."""
        found: dict[int, PredictedRow] = {}
        for r in pred.rows:
            if sampling.mismatch(r, temperature=pred.temperature):
                found.setdefault(r.concurrency, r)
        if not found:
            return
        lines = {str(c): sampling.mismatch_line(
            r, temperature=pred.temperature, vllm_version=self._vllm_version(r.key),
            device=self.loop.engine.device) for c, r in sorted(found.items())}
        stored = st.settings_of(self.study)
        known = stored.sampling_mismatch
        fresh = {c: text for c, text in lines.items() if c not in known}
        if not fresh:
            return
        if not known:
            self.say(fresh.get(str(self.loop.target)) or next(iter(fresh.values())))
        for c, text in fresh.items():
            self.note("sampling", text, f"c={c}")
        st.store_settings(self.study, stored.model_copy(
            update={"sampling_mismatch": {**known, **fresh}}))

    def _vllm_version(self, key: str) -> str | None:
        """The vLLM version a completed launch of config `key` reported (EngineInfo)."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if t.user_attrs.get(TrialAttr.CONFIG_KEY) == key:
                engine = (t.user_attrs.get(TrialAttr.RESULT) or {}).get("engine") or {}
                if engine.get("vllm_version"):
                    return str(engine["vllm_version"])
        return None

    def _calibration_config(self, pred: Prediction) -> TrialConfig | None:
        top = max(self.loop.settings.concurrencies)
        rows = [r for r in pred.rows if r.concurrency == top and r.method != "none"]
        if not rows:
            return None
        best = max(rows, key=lambda r: (r.drafted_per_step, r.acceptance_length or 0))
        return self._config_of(best)

    def _config_of(self, row: PredictedRow) -> TrialConfig:
        """The replayed config a predicted row is of."""
        return self._configs[row.key]

    def _mixed_calibration_row(self, pred: Prediction) -> PredictedRow | None:
        """The predicted row, at the lowest level, of the candidate whose steps are least
        often uniform there (fewest tokens drafted on ties): with the anchor (all steps
        uniform) and the first calibration (mostly uniform at c=1), it pins the cost of a
        non-uniform step."""
        low = min(self.loop.settings.concurrencies)
        done = {m.config.key() for m in self.measured() if m.role == Role.CALIBRATION.value}
        rows = [r for r in pred.rows if r.concurrency == low and r.method != "none"
                and r.key not in done and r.acceptance_length is not None]
        return min(rows, key=lambda r: (r.uniform_share, r.drafted_per_step), default=None)

    @staticmethod
    def _drafted(pred: Prediction, cfg: TrialConfig) -> float:
        return max((r.drafted_per_step for r in pred.rows if r.key == cfg.key()),
                   default=0.0)

    def _print_costs(self, pred: Prediction) -> None:
        for c in sorted(pred.costs):
            self.detail("  step cost " + pred.costs[c].describe())
        if pred.streams:
            self.detail("  " + pred.streams)

    # -- confirming -------------------------------------------------------------------------
    def _throughputs(self, level: int | None = None) -> dict[str, list[float]]:
        """Every config's output throughput at `level` (default: the target level), one
        figure per launch, by config key (missing and zero figures are no measurement)."""
        c, out = level or self.loop.target, {}
        for m in measured_trials(self.study, self.study_dir, captures=False):
            if (lv := m.levels.get(c)) is not None and intervals.logs([lv.output_throughput]):
                out.setdefault(m.config.key(), []).append(lv.output_throughput)
        return out

    def _launch_windows(self) -> dict[str, list[intervals.LaunchWindows]]:
        """Every config's windows at the target level with the digest of the requests they
        hold, one entry per launch, by config key."""
        c, out = self.loop.target, {}
        for m in measured_trials(self.study, self.study_dir, captures=False):
            if (lv := m.levels.get(c)) is not None and lv.windows:
                out.setdefault(m.config.key(), []).append((lv.prompts_digest, lv.windows))
        return out

    def _baselines(self) -> list[TrialConfig]:
        """The plain baseline, and the aligned one where the study measured it."""
        aligned = aligned_config(self.study)
        return [self.loop.space.baseline(), *([aligned] if aligned is not None else [])]

    def _next(self, leaders: list[TrialConfig]) -> TrialConfig:
        """The least-measured of the baselines and the leaders (the plain baseline first on
        ties, then the aligned one), so launches interleave and every ratio gets repeats."""
        throughputs = self._throughputs()
        pool = [*self._baselines(), *leaders]
        return min(pool, key=lambda cfg: (len(throughputs.get(cfg.key(), ())), pool.index(cfg)))

    def _verdict(self, leaders: list[TrialConfig]) -> intervals.Ranking:
        """Decided once two comparisons are resolved by their speedup intervals
        (tuner.intervals.decide: above, below, or within --margin of 1.00x): the best leader
        against the plain baseline, and the best of leaders and baselines against the
        runner-up. The between-launch spread is pooled over every config launched twice at
        the target level. An aligned baseline is ranked too (its ratio is the engine path's
        cost), with each leader's ratio to it, speculation's own gain, and its interval."""
        at, throughputs = self.loop.target, self._throughputs()
        self._paired = self._launch_windows()
        pool = intervals.Pool.of(throughputs.values())
        baselines = self._baselines()
        plain, ranked = baselines[0], [*baselines, *leaders]
        status = intervals.RankingStatus
        for cfg in ranked:
            n = len(throughputs.get(cfg.key(), ()))
            if not intervals.enough(n, pool):
                return intervals.Ranking(status.FEW_LAUNCHES, at, self.margin,
                                         short_of=cfg.label(), launches=n)
        if not leaders:
            return intervals.Ranking(status.NO_LEADER, at, self.margin)
        over = {cfg.key(): self._interval(throughputs, cfg, plain, pool) for cfg in ranked[1:]}
        points = {plain.key(): 1.0, **{k: iv.point for k, iv in over.items()}}
        order = sorted(ranked, key=lambda cfg: -points[cfg.key()])  # the plain one on ties
        best = max(leaders, key=lambda cfg: points[cfg.key()])
        first, second = order[0], order[1]
        pairs = [(best, plain, over[best.key()])]
        if {first.key(), second.key()} != {best.key(), plain.key()}:
            pairs.append((first, second, self._interval(throughputs, first, second, pool)))
        compared = tuple(intervals.Compared(x.label(), y.label(), iv,
                                            intervals.decide(iv, self.margin))
                         for x, y, iv in pairs)
        path, gains = None, ()
        if len(baselines) > 1:  # each leader's speedup as path cost x speculation gain
            aligned = baselines[1]
            path = intervals.Speedup(aligned.label(), self._interval(throughputs, aligned, plain,
                                                                     pool))
            gains = tuple(intervals.Speedup(cfg.label(), self._interval(throughputs, cfg, aligned,
                                                                        pool))
                          for cfg in leaders)
        opened = any(c.decision == intervals.OPEN for c in compared)
        return intervals.Ranking(
            status.OPEN if opened else status.DECIDED, at, self.margin, plain=plain.label(),
            best=intervals.Speedup(best.label(), over[best.key()]),
            first=None if first.key() == plain.key() else intervals.Speedup(
                first.label(), over[first.key()]),
            pairs=compared, over_plain=tuple(intervals.Speedup(cfg.label(), over[cfg.key()])
                                             for cfg in order if cfg.key() != plain.key()),
            pool=pool, path=path, gains=gains)

    def _interval(self, throughputs: dict[str, list[float]], a: TrialConfig, b: TrialConfig,
                  pool: intervals.Pool) -> intervals.Interval | None:
        """A's speedup over B with its interval at the study's --confidence, the paired
        within-level spread of their windows added (tuner.intervals.Within)."""
        within = intervals.Within.paired(self._paired.get(a.key(), ()),
                                         self._paired.get(b.key(), ()))
        return intervals.speedup(throughputs.get(a.key(), ()), throughputs.get(b.key(), ()), pool=pool,
                                 confidence=1 - (1 - self.confidence) / self._looks,
                                 within=within)


def measured_trials(study: Any, study_dir: Path, *, captures: bool = True
                    ) -> list[MeasuredTrial]:
    """Every completed trial with a result, as the predictor takes them; a repeat carries the
    role of the trial it repeats (a baseline's repeat is a baseline run)."""
    trials = study.get_trials(deepcopy=False)
    roles = {t.number: t.user_attrs.get(TrialAttr.ROLE) for t in trials}
    out = []
    for t in trials:
        if t.state != TrialState.COMPLETE or TrialAttr.DUPLICATE_OF in t.user_attrs \
                or TrialAttr.RESULT not in t.user_attrs:
            continue
        result = BenchResult.model_validate(t.user_attrs[TrialAttr.RESULT])
        role = t.user_attrs.get(TrialAttr.ROLE) or Role.SEARCH.value
        if role == Role.REPEAT.value:
            role = roles.get(t.user_attrs.get(TrialAttr.REPEAT_OF)) or role
        levels: dict[int, LevelMetrics] = {lv.concurrency: lv for lv in result.levels}
        path = t.user_attrs[TrialAttr.RESULT].get("engine", {}).get("details") or {}
        out.append(MeasuredTrial(
            number=t.number, config=result.config, role=role, levels=levels,
            capture=st.token_capture(study_dir, t) if captures else None,
            cudagraph_mode=path.get("cudagraph_mode"),
            ngram_path=enginepath.ngram_path_of(path, result.config.method)))
    return out


def _checks(pred: Prediction, c: int, accuracy_log: float, *, base_launches: int
            ) -> list[ThroughputCheck]:
    """Every launched speculative config at level c: its measured throughput against the
    prediction on its paired requests; those the step cost was fitted on (calibration) are
    kept as `fitted`, never a miss."""
    out = []
    for r in pred.rows:
        meas, want = r.meas_output_throughput, r.pred_output_throughput
        if (r.concurrency != c or r.method == "none" or meas is None
                or want is None or not meas > 0 or not want > 0):
            continue
        out.append(ThroughputCheck(
            label=r.label, concurrency=c, predicted=want, measured=meas,
            error_pct=100.0 * (want - meas) / meas,
            accuracy_pct=100.0 * (math.exp(accuracy_log) - 1.0),
            missed=not r.calibration and abs(math.log(meas / want)) > accuracy_log,
            launches=max(1, r.measured_trials or 1), base_launches=max(1, base_launches),
            fitted=bool(r.calibration)))
    return out


def _pm(row: PredictedRow) -> str:
    """A predicted throughput's sampling half-width as the leaders line shows it, " ±3.1"
    (tuner.replay.sampling); nothing at temperature 0."""
    pm = row.pred_output_throughput_pm
    return f" \u00b1{pm:.1f}" if isinstance(pm, float) and pm == pm else ""


def _diverse(ranked: list[PredictedRow], n: int) -> list[PredictedRow]:
    """The best predicted config of each method first, then the next best overall: two
    variants of one method predicted within a percent of each other would spend the launches
    on a ranking nobody needs, while the best of each method answers which method to run."""
    firsts: dict[str, PredictedRow] = {}
    for row in ranked:
        firsts.setdefault(row.method, row)
    picked = list(firsts.values())[:n]
    picked += [r for r in ranked if r not in picked][:n - len(picked)]
    return sorted(picked, key=ranked.index)


def ladder_predictions(ladder_runs: list[LadderRun], chosen: TrialConfig, *, study_dir: Path,
                       limits: EngineLimits, k_max: int | None = None,
                       temperature: float = 0.0) -> dict[int, dict[int, float]] | None:
    """The load-aware policy's predicted curves: for every K from 1 to k_max (default: the
    chosen config's K) of `chosen`, the predicted speedup over the baseline at each ladder
    level, from the ladder baseline's tokens and a step cost fitted on the ladder's measured
    speculative runs, at the study's sampling `temperature` (as tuner.replay.predict takes
    it). None when the method cannot be replayed or no baseline run has tokens.
    Returns {K: {concurrency: predicted speedup}}."""
    if not acceptance.replayable(chosen) or chosen.engine_args:
        return None
    measured, base_capture = _ladder_measured(ladder_runs, study_dir)
    if base_capture is None:
        return None
    configs = [chosen.with_k(k) for k in range(1, (k_max or chosen.k or 1) + 1)]
    pred = predict(base_capture, configs, measured, max_model_len=limits.max_model_len,
                   max_num_seqs=limits.max_num_seqs, temperature=temperature)
    k_of = {cfg.key(): cfg.k for cfg in configs}
    out: dict[int, dict[int, float]] = {}
    for row in pred.rows:
        k = k_of.get(row.key)
        if k is not None and row.pred_speedup is not None:
            out.setdefault(k, {})[row.concurrency] = float(row.pred_speedup)
    return out or None


def _ladder_measured(ladder_runs: list[LadderRun], study_dir: Path
                     ) -> tuple[list[MeasuredTrial], TokenCapture | None]:
    """The ladder's measured runs as the predictor takes them (numbered by their place in
    `ladder_runs`), and the first baseline run's token capture."""
    measured, base_capture = [], None
    for i, run in enumerate(ladder_runs):
        result = run.result
        if result is None:
            continue
        capture = _run_capture(run, study_dir)
        role = "baseline" if not result.config.speculative_config else "search"
        if run.role == Role.ALIGNED_BASELINE.value:
            role = Role.ALIGNED_BASELINE.value  # anchors the step cost on the speculative path
        if role == "baseline" and base_capture is None:
            base_capture = capture
        measured.append(MeasuredTrial(number=i, config=result.config, role=role,
                                      levels={lv.concurrency: lv for lv in result.levels},
                                      capture=capture, ngram_path=enginepath.ngram_path_of(
                                          result.engine.details, result.config.method)))
    return measured, base_capture


def _run_capture(run: LadderRun, study_dir: Path) -> TokenCapture | None:
    """A ladder run's token capture, or None when it has none or its file cannot be read."""
    if run.tokens is None:
        return None
    try:
        return TokenCapture.load(study_dir / run.tokens.file)
    except (OSError, ValueError, KeyError):
        return None

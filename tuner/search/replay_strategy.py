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
(StudyView.align) is launched next, anchors the step-cost line, and is repeated beside the
plain one, so each leader's ratio splits into path cost x speculation gain.

Every launch is an ordinary trial of the study (roles baseline, calibration, confirm,
repeat), so reports and a later `--strategy optuna` resume read them as always; each level's
selection is stored with the study (tuner.search.study.store_selections), and the answer
rests on it. --n-trials is the number of engine launches. The strategy never launches: the
loop does (tuner.search.strategy); the selections, or the ranking the confirm launches
reach, come back as figures in the Stop (tuner.outputs words them).

This module holds the phases' order, the calibration and the predictions; its parts live
beside it: tuner.search.candidates (what is replayed, and the climb), replay_select (the
levels decided over the workload sample), replay_confirm with tuner.search.ranking (the
leaders confirmed without one), tuner.search.trials (the stored trials the predictor takes).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from tuner import intervals
from tuner.records import decisions as ev
from tuner.records.configs import EngineLimits, TrialConfig
from tuner.records.predictions import PredictedRow
from tuner.records.selection import Selection
from tuner.records.trials import Role
from tuner.replay import forecast, sampling
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import Prediction, misses, predict
from tuner.search import study as st
from tuner.search.candidates import candidates, refine, refine_limit
from tuner.search.replay_confirm import ConfirmPhase
from tuner.search.replay_phase import Flow, Phase
from tuner.search.replay_select import SelectPhase
from tuner.search.strategy import Launch, Step, Stop, StopReason, StudyView
from tuner.search.trials import measured_trials
from tuner.tokens import TokenCapture


def _ignore(_shown: object) -> None:
    return None


@dataclass(frozen=True)
class Watch:
    """Who is shown what the strategy finds as it goes: each new prediction (the study's
    predicted.csv), each level's selection (the lines a person reads)."""

    prediction: Callable[[Prediction], None] = _ignore
    selection: Callable[[tuple[Selection, ...]], None] = _ignore


class ReplaySearch(ConfirmPhase, SelectPhase):
    """The replay strategy (tuner.search.strategy Strategy): the phases run in order, each
    launch handed to the loop that launches it as a Launch and its outcome told back before
    the strategy goes on (`sequential`); it reads the study through the StudyView of the
    latest ask; --n-trials counts every engine launch, repeats included."""

    sequential = True
    counts_repeats = True

    def __init__(self, *, study_dir: Path, limits: EngineLimits,
                 leaders: int = 2, seed: int = 0, watch: Watch | None = None,
                 confidence: float = intervals.CONFIDENCE,
                 margin: float = intervals.MARGIN) -> None:
        self.view: Any = None  # the StudyView of the latest ask
        self.study_dir = study_dir
        self.limits, self.leaders, self.seed = limits, leaders, seed
        # The confirm launches end when speedup intervals at this confidence decide the
        # ranking; within `margin` of 1.00x two configs are as good as each other.
        self.confidence, self.margin = confidence, margin
        watch = watch or Watch()
        self.on_prediction, self.on_selection = watch.prediction, watch.selection
        self._sample_memo: dict = {}  # the sample's replays (tuner.replay.forecast)
        self._failed: set[str] = set()  # config keys whose launch failed: never a subject
        self._looks = 1  # how many times _confirm may look at the ranking (set there)
        self.prediction: Prediction | None = None
        self._memo: dict = {}  # replays survive re-predictions (acceptance never changes)
        self._configs: dict[str, TrialConfig] = {}  # the configs replayed, by key
        self.phase = Phase.BASELINE
        self._flow: Flow[Stop] | None = None  # the phases, started by the first ask
        self._told: FrozenTrial | None = None  # the last launch's outcome, for the flow
        self._stop: Stop | None = None
        self._ran_out: StopReason | None = None  # the budget's end, said once (_room)

    # -- the strategy -----------------------------------------------------------------------
    def ask(self, view: StudyView) -> Step:
        """The next launch of the phases, or how they ended (NO_TOKENS: the Optuna search
        takes over)."""
        self.view = view
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

    @property
    def study(self) -> Any:
        return self.view.study

    def record(self, event: ev.Event, *, store: bool = True, show: bool = True) -> None:
        """Record `event` (tuner.records.decisions) through the view: its lines shown,
        the decision kept for the report."""
        self.view.record(event, store=store, show=show)

    def _phases(self) -> Flow[Stop]:
        """Baseline, replay (calibrating and climbing), confirm: each `yield` a launch, and
        the trial it completed as (None: it failed) sent back."""
        base = yield from self._baseline()
        if base is None:
            return Stop(StopReason.NO_BASELINE)  # failure_summary tells the user why
        yield from self._align()  # a given aligned baseline; "auto" on a resumed study
        capture = st.token_capture(self.study_dir, base)
        if capture is None:
            self.record(ev.NoTokens())
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
        room = self.view.room()
        if room is not None and self._ran_out is None:
            self._ran_out = room
            self.record(ev.BudgetSpent(
                limit="timeout" if room == StopReason.TIMEOUT else "n_trials",
                timeout_s=self.view.timeout_s, n_trials=self.view.n_trials, launches=True))
        return room is None

    def _baseline(self) -> Flow[Any]:
        """The study's plain baseline, launched where it has none yet; None where the budget
        is spent or the launch failed."""
        self.phase = Phase.BASELINE
        base = self._first(st.is_baseline)
        if base is None and self._room():
            base = yield self._launch(self.view.space.baseline(), Role.BASELINE)
            if base is not None:
                self._say_expected_time(base)
        return base

    def _say_expected_time(self, base: Any) -> None:
        """Every launch sends the same requests, so the baseline's launch says what the others
        cost: said once, with the launches the budget leaves."""
        wall = st.stored(base).wall_s
        left = self.view.n_trials - self.launches()
        if not wall or left <= 0:
            return
        self.record(ev.ExpectedTime(requests=self.view.requests_per_launch, baseline_s=wall,
                                  launches_left=left))

    def _replay_space(self, capture: TokenCapture) -> Flow[Prediction]:
        """Predict the space over the baseline's tokens, with the calibration launches the
        step cost needs and the climb around the predicted leaders."""
        self.phase = Phase.REPLAY
        configs = candidates(self.view.space, seed=self.seed)
        self._configs = {c.key(): c for c in configs}
        self.record(ev.ReplayStarted(configs=len(configs), space=self.view.space.name))
        pred = self._predict(capture)
        self.record(ev.SpaceReplayed(
            configs=pred.configs, space=self.view.space.name, seconds=pred.seconds,
            requests_per_level=len(capture.level(capture.levels()[0], warmup=False))))
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
        self.record(ev.Calibration(label=calib.label(),
                                 drafted_per_step=self._drafted(pred, calib)))
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
        self.record(ev.MixedCalibration(label=calib.label(), uniform_share=row.uniform_share,
                                      concurrency=row.concurrency))
        yield self._launch(calib, Role.CALIBRATION)
        return self._predict(capture)

    def _climb(self, capture: TokenCapture, pred: Prediction) -> Prediction:
        """Replay the grid neighbours of the predicted leaders (`refine`)."""
        started = time.monotonic()
        configs, pred, added = refine(self.view.space, list(self._configs.values()), pred,
                                      lambda more: self._predict(capture, more, show=False),
                                      limit=refine_limit(capture))
        if added:
            self._configs = {c.key(): c for c in configs}
            self._show(pred)
            self.record(ev.Climb(added=added, configs=len(configs),
                               seconds=time.monotonic() - started))
        return pred

    # -- launching --------------------------------------------------------------------------
    def launches(self) -> int:
        """Engine launches in this study so far (repeats included; answers from storage and
        trials a dead driver left behind are not)."""
        return st.counted_trials(self.study, repeats=True)

    def _launch(self, config: TrialConfig, role: Role | None) -> Launch:
        """`config` to measure once as a trial of the study; `role` None: a confirm launch,
        a repeat where the config was measured before."""
        first = self._first(lambda t: st.stored(t).config_key == config.key())
        if role is None:
            role = Role.REPEAT if first is not None else Role.CONFIRM
        return Launch(config, role, repeat_of=first.number if role == Role.REPEAT else None)

    def _align(self) -> Flow[None]:
        """Launch the aligned baseline when the loop says it is due (StudyView.align: once
        per study). It anchors the step-cost line on the speculative engine path, so the
        predictions carry the path's cost (tuner.replay.cost)."""
        if self._room() and (config := self.view.align()) is not None:
            yield self._launch(config, Role.ALIGNED_BASELINE)

    def _first(self, match: Callable[[Any], bool]) -> Any:
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if st.stored(t).role != Role.REPEAT and match(t):
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
                       temperature=self.view.workload.spec.temperature)
        if show:
            self._show(pred)
        return pred

    def _show(self, pred: Prediction) -> None:
        """The table the study keeps (predicted.csv, plots, report), and the step cost and
        token streams it was priced with (the report's "How it was decided")."""
        self.prediction = pred
        self.on_prediction(pred)
        for c in sorted(pred.costs):
            self.record(pred.costs[c].fit_record(), show=False)
        if pred.streams:
            self.record(ev.TokenStreams(line=pred.streams), show=False)
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
            self.record(ev.PredictionMissed(miss=m))
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
            device=self.view.engine.device) for c, r in sorted(found.items())}
        stored = st.settings_of(self.study)
        known = stored.sampling_mismatch
        fresh = {c: text for c, text in lines.items() if c not in known}
        if not fresh:
            return
        # One line said (the target level's where it is among them), every level kept.
        said = None if known else (str(self.view.target) if str(self.view.target) in fresh
                                   else next(iter(fresh)))
        for c, text in fresh.items():
            self.record(ev.SamplingMismatch(concurrency=int(c), line=text), show=c == said)
        st.store_settings(self.study, stored.model_copy(
            update={"sampling_mismatch": {**known, **fresh}}))

    def _vllm_version(self, key: str) -> str | None:
        """The vLLM version a completed launch of config `key` reported (EngineInfo)."""
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            s = st.stored(t)
            if s.config_key == key and s.result is not None and s.result.engine.vllm_version:
                return str(s.result.engine.vllm_version)
        return None

    def _calibration_config(self, pred: Prediction) -> TrialConfig | None:
        top = max(self.view.settings.concurrencies)
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
        low = min(self.view.settings.concurrencies)
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
            self.record(pred.costs[c].fit_record(), store=False)
        if pred.streams:
            self.record(ev.TokenStreams(line=pred.streams), store=False)

    # -- confirming -------------------------------------------------------------------------
    def _throughputs(self, level: int | None = None) -> dict[str, list[float]]:
        """Every config's output throughput at `level` (default: the target level), one
        figure per launch, by config key (missing and zero figures are no measurement)."""
        c, out = level or self.view.target, {}
        for m in measured_trials(self.study, self.study_dir, captures=False):
            if (lv := m.levels.get(c)) is not None and intervals.logs([lv.output_throughput]):
                out.setdefault(m.config.key(), []).append(lv.output_throughput)
        return out


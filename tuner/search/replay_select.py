"""Search stage, the replay strategy's select phase over a workload sample: every level
decided on the forecast over the sample (tuner.replay.forecast, tuner.replay.selection), a
level's chosen config launched to confirm the step cost, the chosen config and the baseline in
turn only where more launches would decide the level.

A part of tuner.search.replay_strategy ReplaySearch, which mixes it in: its methods read the
strategy's view, configs and launches (`view`, `study`, `_configs`, `_throughputs`,
`_launch`, `_align`, `_predict`, `_room`, `measured`) and store each level's selection with
the study.
"""

from __future__ import annotations

import math

from tuner import intervals
from tuner.records.configs import TrialConfig
from tuner.records.selection import Choice, Selection, ThroughputCheck, Undecided
from tuner.replay import forecast, selection
from tuner.replay.predict import Prediction
from tuner.replay.yardstick import yardsticks
from tuner.search import noise_profile
from tuner.search import study as st
from tuner.search.replay_phase import Flow, Phase
from tuner.search.strategy import Stop, StopReason
from tuner.tokens import TokenCapture


class SelectPhase:
    """Each level's selection, decided on the forecast and confirmed by launches
    (ReplaySearch mixes it in)."""

    def _select(self, capture: TokenCapture, sample: TokenCapture, pred: Prediction
                ) -> Flow[Stop]:
        """Decide every level on the forecast over the workload sample
        (tuner.replay.selection); launch a level's subject where it was never launched, and
        the subject and the baseline in turn where more launches would decide the level,
        until every level is decided, launches cannot decide what is open, or the budget is
        spent. Configs within the indifference zone of a subject are never launched against
        it."""
        self.phase = Phase.CONFIRM
        plain = self.view.space.baseline()
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
        ordered = sorted(selections, key=lambda s: s.concurrency != self.view.target)
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
        plain_key = self.view.space.baseline().key()
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

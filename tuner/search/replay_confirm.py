"""Search stage, the replay strategy's confirm phase without a workload sample (--sample-prompts
0, a study stored before it): the predicted leaders are launched in turn with the baselines
until speedup intervals decide the ranking (tuner.search.ranking), or the budget is spent.

A part of tuner.search.replay_strategy ReplaySearch, which mixes it in: its methods read the
strategy's view, configs and launches (`view`, `study`, `_throughputs`, `_launch`, `_align`,
`_predict`, `_room`, `_config_of`) and record what they find through it (`record`).
"""

from __future__ import annotations

from tuner import intervals
from tuner.records import decisions as ev
from tuner.records.configs import TrialConfig
from tuner.records.predictions import PredictedRow
from tuner.replay import sampling
from tuner.replay.predict import Prediction
from tuner.search import ranking
from tuner.search.replay_phase import Flow, Phase
from tuner.search.strategy import Stop, StopReason
from tuner.search.trials import aligned_config, measured_trials
from tuner.tokens import TokenCapture


class ConfirmPhase:
    """The leaders picked from the prediction, confirmed by launches (ReplaySearch mixes it
    in)."""

    def _pick_leaders(self, pred: Prediction) -> list[TrialConfig]:
        """The predicted leaders at the target level to confirm by launches (`_diverse`);
        where the baseline sampled, which of them (and how many more) the replay cannot
        order against the best (sampling.within)."""
        target = self.view.target
        ranked = pred.leaders(target, 10_000)
        top = _diverse(ranked, self.leaders)
        if not top:
            self.record(ev.NoLeader())
            return []
        self.record(ev.Leaders(concurrency=target, leaders=tuple(ev.Leader(
            label=r.label, output_throughput=r.pred_output_throughput,
            output_throughput_pm=_pm(r), speedup=r.pred_speedup) for r in top)))
        tied = [r for r in ranked[1:] if sampling.within(r, ranked[0])]
        if tied:
            self.record(ev.TiedLeaders(temperature=pred.temperature, tied=len(tied),
                                     best=ranked[0].label,
                                     launched=tuple(r.label for r in tied if r in top)))
        return [self._config_of(r) for r in top]

    def _confirm(self, leaders: list[TrialConfig], capture: TokenCapture) -> Flow[Stop]:
        """Launch the baselines and the leaders in turn until the ranking is decided or the
        budget is spent; the Stop carries the ranking (none where a baseline failed or every
        leader did). The ranking is looked at before every launch, so each look's
        intervals are taken at 1 - (1 - confidence) / looks (Bonferroni over the looks the
        budget allows): the chance of a wrong decision over the whole confirmation stays
        within the stated confidence."""
        self.phase = Phase.CONFIRM
        self._looks = max(1, self.view.n_trials - self.launches() + 1)
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

    def _drop(self, pick: TrialConfig, leaders: list[TrialConfig]) -> bool:
        """A failed launch is recorded as a FAIL trial; launching the same config again would
        spend the budget on it, so it leaves the ranking. False when the confirmation ends
        there (a baseline failed, or no leader is left)."""
        self.record(ev.LaunchFailed(label=pick.label(), key=pick.key(), leader=pick in leaders))
        if pick not in leaders:
            return False
        leaders.remove(pick)
        return bool(leaders)

    def _launch_windows(self) -> dict[str, list[intervals.LaunchWindows]]:
        """Every config's windows at the target level with the digest of the requests they
        hold, one entry per launch, by config key."""
        c, out = self.view.target, {}
        for m in measured_trials(self.study, self.study_dir, captures=False):
            if (lv := m.levels.get(c)) is not None and lv.windows:
                out.setdefault(m.config.key(), []).append((lv.prompts_digest, lv.windows))
        return out

    def _baselines(self) -> list[TrialConfig]:
        """The plain baseline, and the aligned one where the study measured it."""
        aligned = aligned_config(self.study)
        return [self.view.space.baseline(), *([aligned] if aligned is not None else [])]

    def _next(self, leaders: list[TrialConfig]) -> TrialConfig:
        """The least-measured of the baselines and the leaders (the plain baseline first on
        ties, then the aligned one), so launches interleave and every ratio gets repeats."""
        throughputs = self._throughputs()
        pool = [*self._baselines(), *leaders]
        return min(pool, key=lambda cfg: (len(throughputs.get(cfg.key(), ())), pool.index(cfg)))

    def _verdict(self, leaders: list[TrialConfig]) -> intervals.Ranking:
        """The ranking the confirm launches reach so far (tuner.search.ranking rank), each
        look at 1 - (1 - confidence) / looks."""
        return ranking.rank(leaders=leaders, baselines=self._baselines(),
                            throughputs=self._throughputs(), windows=self._launch_windows(),
                            target=self.view.target, margin=self.margin,
                            confidence=1 - (1 - self.confidence) / self._looks)


def _pm(row: PredictedRow) -> float | None:
    """A predicted throughput's sampling half-width (tuner.replay.sampling); None at
    temperature 0."""
    pm = row.pred_output_throughput_pm
    return pm if isinstance(pm, float) and pm == pm else None


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

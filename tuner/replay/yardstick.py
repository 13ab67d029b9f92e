"""Replay stage, the yardstick a prediction is priced on: requests played out on the fitted step
cost (`play`), and per level a measured baseline played the same way, so a predicted
throughput is the baseline's measured one times the ratio of the two played durations and what
the play leaves out cancels (a traffic's replay is priced on the same: tuner.replay.traffic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.records.trials import Role
from tuner.replay import cost, schedule
from tuner.replay.measured import MeasuredTrial, finite, pooled
from tuner.replay.replayer import level_output_lengths, level_prompt_lengths
from tuner.tokens import TokenCapture


def play(step: cost.StepCost, drafts: list[np.ndarray], lengths: list[int],
         prompts: list[int], *, k: int, slots: int) -> schedule.Schedule:
    """Requests of these output and prompt lengths, with these drafts per verify step (k = 0:
    no speculation), played out on the fitted step cost with `slots` in flight."""
    return schedule.simulate(drafts, lengths, concurrency=slots, k=k,
                             step_ms=step.speculative_step_ms if k else step.step_ms,
                             prompts=prompts, prefill_ms_per_token=step.prefill.ms_per_token,
                             overhead_ms=step.prefill.overhead_ms)


@dataclass(frozen=True)
class Yardstick:
    """A measured baseline and its level played out on the fitted costs: every predicted
    duration is set against it, so what the play leaves out (the load generator's own time,
    the frontend) cancels. `plain_throughput`: the plain baseline's measured, where the
    yardstick is an aligned baseline (else its own)."""

    played: schedule.Schedule
    measured_throughput: float
    plain_throughput: float | None = None

    def throughput(self, played: schedule.Schedule) -> float | None:
        """The measured throughput of `played`, a play of the yardstick's own requests."""
        if played.duration_ms <= 0 or not finite(self.measured_throughput):
            return None
        return self.measured_throughput * self.played.duration_ms / played.duration_ms

    @property
    def factor(self) -> float | None:
        """Measured over played throughput: what turns a played throughput of other requests
        (a traffic's, tuner.replay.traffic.price) into a measured one."""
        played = self.played.output_throughput
        return self.measured_throughput / played if played and finite(
            self.measured_throughput) else None

    @property
    def path_ratio(self) -> float | None:
        """The plain baseline's measured throughput over the yardstick's (1 where the yardstick
        is the plain baseline)."""
        if not finite(self.plain_throughput) or not finite(self.measured_throughput) \
                or not self.measured_throughput:
            return None
        return self.plain_throughput / self.measured_throughput


def yardsticks(capture: TokenCapture, measured: Sequence[MeasuredTrial],
               costs: dict[int, cost.StepCost], *, max_num_seqs: int) -> dict[int, Yardstick]:
    """Per level of `costs`: the baseline the step cost is anchored on (the aligned one where
    the study measured it), `capture`'s requests at that level played out on the fitted cost,
    beside its measured throughput. Levels nothing measured or no cost prices are left out."""
    plain = pooled([m for m in measured if m.role == Role.BASELINE])
    anchor = pooled([m for m in measured if m.aligned]) or plain
    out = {}
    for c, step in costs.items():
        if c in anchor and (played := _played_baseline(step, capture, c,
                                                       min(c, max_num_seqs))) is not None:
            out[c] = Yardstick(played, anchor[c]["output_throughput"],
                               plain[c]["output_throughput"] if c in plain else None)
    return out


def _played_baseline(step: cost.StepCost | None, capture: TokenCapture, c: int,
                     slots: int) -> schedule.Schedule | None:
    """No speculation, the capture's requests, played out on the fitted costs."""
    lengths = level_output_lengths(capture, c)
    if step is None or not step.calibrated or not lengths:
        return None
    return play(step, schedule.baseline_drafts(lengths), lengths, level_prompt_lengths(capture, c),
                k=0, slots=slots)

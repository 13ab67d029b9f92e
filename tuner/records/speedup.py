"""Records, a speedup: a measured figure with its run-to-run spread, the split of a speedup
over the plain baseline into the engine path's cost and speculation's own gain (analysis, the
replay's predictions and outputs all read it), and the one wording of a ratio."""

from __future__ import annotations

import math

from tuner.records.configs import Frozen


class Measured(Frozen):
    """A figure (a throughput, or a ratio of two) with its run-to-run spread as a fraction of
    it: MAD over median of its repeats; NaN where it was measured once."""

    value: float
    relative_spread: float = math.nan

    @property
    def spread(self) -> float:
        """The spread in the figure's own units (NaN where not measured)."""
        return self.value * self.relative_spread

    def over(self, base: Measured) -> Measured:
        """This figure over `base` (NaN where `base` is not positive), with the larger relative
        spread of the two: a ratio is known no better than its less certain side."""
        value = self.value / base.value if base.value > 0 else math.nan
        known = [r for r in (self.relative_spread, base.relative_spread) if not math.isnan(r)]
        return Measured(value=value, relative_spread=max(known) if known else math.nan)


class SpeedupSplit(Frozen):
    """A speedup over the plain baseline (what a user gets today) = the engine path's cost (the
    aligned baseline over the plain one: the speculative configs' engine path without
    speculation) x speculation's own gain (the config over the aligned baseline); exactly, as
    ratios of the same throughputs. tuner.analysis.decomposition names its fields in tables
    and documents."""

    total_speedup: Measured
    path_cost: Measured
    speculation_gain: Measured

    @classmethod
    def of(cls, throughput: Measured, *, plain: Measured, aligned: Measured
           ) -> SpeedupSplit | None:
        """None where either baseline's throughput is not a positive number; an unknown (NaN)
        `throughput` leaves the total and the gain NaN and the path's cost known."""
        if not all(math.isfinite(b.value) and b.value > 0 for b in (plain, aligned)):
            return None
        return cls(total_speedup=throughput.over(plain), path_cost=aligned.over(plain),
                   speculation_gain=throughput.over(aligned))

    def __str__(self) -> str:
        return split_text(self.path_cost.value, self.path_cost.spread,
                          self.speculation_gain.value, self.speculation_gain.spread)


class ConfigSplit(Frozen):
    """One config's SpeedupSplit at a level as a recommendation carries it (recommendation.json's
    `decomposition`): its label, and each ratio with its spread in the ratio's units, None
    where unknown (an unknown throughput leaves the total and the gain unknown; the spread of
    a config measured once)."""

    label: str
    total_speedup: float | None = None
    total_speedup_spread: float | None = None
    path_cost: float
    path_cost_spread: float | None = None
    speculation_gain: float | None = None
    speculation_gain_spread: float | None = None

    def split_text(self) -> str:
        """The split in its one wording: "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04"."""
        return split_text(self.path_cost, self.path_cost_spread, self.speculation_gain,
                          self.speculation_gain_spread)


# The one wording of a ratio and of the split. It lives with the records because analysis
# writes it into recommendation.json and policy.json and may not import tuner.outputs, whose
# tables and plots (tuner.outputs.text) must write it the same.
def ratio_text(value: float | None, spread: float | None = None) -> str:
    """A ratio as every table and sentence shows it: "1.07x \u00b10.02" (the spread in the
    ratio's units), the spread left out where it was not measured; "-" without a value."""
    if value is None or math.isnan(value):
        return "-"
    return f"{value:.2f}x" + ("" if spread is None or math.isnan(spread)
                              else f" \u00b1{spread:.2f}")


def split_text(path: float | None, path_spread: float | None, gain: float | None,
               gain_spread: float | None) -> str:
    """The split in one wording: "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04"."""
    return f"path {ratio_text(path, path_spread)} x speculation {ratio_text(gain, gain_spread)}"

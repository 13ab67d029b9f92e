"""A recommendation in words: its reason and how sure it is, from the figures of its verdict
(tuner.records.recommendations.Verdict, which tuner.analysis.recommend decides). The terminal, the
report and recommendation.json all say them through here, so they say the same.
"""

from __future__ import annotations

from collections.abc import Mapping

from tuner import intervals
from tuner.analysis.noise import MIN_DIFFERENCE, UNMEASURED_NOISE, noise_floor
from tuner.analysis.recommend import MIN_CANDIDATES
from tuner.outputs import selection
from tuner.records.recommendations import (
    Basis,
    Noise,
    Recommendation,
    SpeedupInterval,
    Verdict,
    WordedRecommendation,
)
from tuner.records.speedup import ConfigSplit, ratio_text


def reason(rec: Recommendation) -> str:
    """Why the recommendation is what it is, in sentences."""
    v = rec.verdict
    text = (selection.answer_text(v.selection) if v.selection is not None
            else _REASONS[v.basis](rec, v))
    tail = f" {v.sampling_mismatch}" if v.sampling_mismatch else ""
    return text + tail + "".join(f" {m.text()}" for m in rec.prediction_misses)


def confidence(rec: Recommendation) -> str:
    """How sure the answer is ("" for a refusal): from the speedup interval where the
    launches give one (high where it is settled, low where it is open), else from the gain
    against the MADs."""
    v = rec.verdict
    if v.selection is not None:
        return selection.confidence(v.selection)
    if v.subject is None or v.speedup is None or v.measurements is None:
        return ""
    gain = v.speedup - 1.0
    iv = v.interval
    if iv is not None:
        said = {intervals.ABOVE: "lies above 1.00x", intervals.BELOW: "lies below 1.00x",
                intervals.EQUIVALENT: f"lies within \u00b1{intervals.percent(iv.margin)} of "
                                      "1.00x (no difference that matters)",
                intervals.OPEN: f"holds 1.00x and reaches beyond \u00b1"
                                f"{intervals.percent(iv.margin)}: more launches narrow it"}
        pool = intervals.Pool(sd=iv.pool_sd, df=iv.pool_df, configs=iv.pool_configs)
        return (f"{'low' if iv.decision == intervals.OPEN else 'high'}: {iv.launches[0]} "
                f"launch(es) of {v.subject}, {iv.launches[1]} of the baseline; the "
                f"{_interval(iv).bounds()} of its speedup ({iv.point:.2f}x) "
                f"{said[iv.decision]} ({pool.text()}).")
    n_win, n_base = v.measurements
    runs = f"{n_win} measurement(s) of {v.subject}, {n_base} of the baseline"
    spread_rel = v.noise_spread
    if spread_rel is None:
        windows, unsettled = _windows_clause(v, gain)
        if abs(gain) >= 0.25 and not unsettled:
            return (f"medium: {runs}; spread not measured, but a {gain:+.0%} difference is far "
                    f"beyond typical run-to-run noise (a few percent){windows}.")
        return (f"low: {runs}; spread not measured, and a {gain:+.1%} difference can be "
                f"run-to-run noise{windows}. Re-measure before relying on it.")
    margin = abs(gain) / noise_floor(spread_rel)
    level = "high" if min(n_win, n_base) >= 3 and margin >= 2 else (
        "medium" if margin > 1 else "low")
    floor = (f" (a difference must exceed {MIN_DIFFERENCE:.0%} to count)"
             if spread_rel < MIN_DIFFERENCE else "")
    return (f"{level}: {runs}; throughput difference {gain:+.1%} against a spread (MAD) of "
            f"\u00b1{spread_rel:.1%}{floor}.")


def worded(rec: Recommendation) -> WordedRecommendation:
    """The recommendation as recommendation.json holds it: its fields and its words."""
    return WordedRecommendation.model_construct(
        **dict(rec), reason=reason(rec), confidence=confidence(rec))


# --- the reasons, one per basis --------------------------------------------------------------
def _no_baseline(rec: Recommendation, v: Verdict) -> str:
    why = (f" The baseline trial failed: {v.baseline_failure}" if v.baseline_failure
           else " The baseline trial failed without a recorded reason."
           if v.baseline_failure is not None
           else " The baseline trial has not finished yet." if v.baseline_waiting else "")
    return (f"No baseline (no speculation) was measured at concurrency {rec.concurrency}, so "
            f"no speedup can be stated.{why} Measure it with: {rec.verify_command}")


def _too_few_configs(rec: Recommendation, v: Verdict) -> str:
    return (f"Only {v.configs_completed} speculative config(s) completed at concurrency "
            f"{rec.concurrency}; at least {MIN_CANDIDATES} besides the baseline are needed "
            f"before choosing one. Run more trials (or resume the study).")


def _nothing_meets_the_slos(rec: Recommendation, v: Verdict) -> str:
    return (f"No measured config meets {slo_text(rec.slos)} at concurrency {rec.concurrency}; "
            f"the lowest mean TPOT was {v.subject_tpot_ms:.1f} ms ({v.subject}, p99 TTFT "
            f"{v.subject_p99_ttft_ms:.0f} ms). Relax the SLOs, or search other methods.")


def _nothing_beats_the_baseline(rec: Recommendation, v: Verdict) -> str:
    among = f" among the configs meeting {slo_text(rec.slos)}" if v.slos_set else ""
    return (f"Leave speculation off at concurrency {rec.concurrency}: no speculative config beat "
            f"the baseline (no speculation){among}. The fastest one, {v.subject}, reached "
            f"{v.speedup:.2f}x the baseline's throughput ({v.subject_throughput:.1f} against "
            f"{v.baseline_throughput:.1f} tok/s).{_interval_sentence(v)} Serve without "
            "--speculative-config." + _split_sentence(rec.decomposition))


def _no_measurable_difference(rec: Recommendation, v: Verdict) -> str:
    noise_text, resolve = _noise_words(v)
    noise_text = f"not more than {noise_text}"
    if v.basis != Basis.WITHIN_NOISE and v.interval is not None:  # the interval decided
        where = {Basis.INTERVAL_EQUIVALENT: f"lies within \u00b1"
                                            f"{intervals.percent(v.interval.margin)} of 1.00x",
                 Basis.INTERVAL_OPEN: "holds 1.00x, so no gain is shown"}.get(
                     v.basis, "lies below 1.00x")
        noise_text = (f"more than the launches' spread (\u00b1{v.noise_floor:.1%}), but its "
                      f"{_interval(v.interval).bounds()} {where}, and the interval over all "
                      "launches decides")
        resolve = "A smaller --margin and more launches can tell a difference this small."
    among = f" meeting {slo_text(rec.slos)}" if v.slos_set else ""
    return (f"Leave speculation off at concurrency {rec.concurrency}: no measurable difference. "
            f"The fastest config{among}, {v.subject}, reached {v.speedup:.2f}x the baseline's "
            f"throughput ({v.subject_throughput:.1f} against {v.baseline_throughput:.1f} "
            f"tok/s, {v.speedup - 1.0:+.1%}), {noise_text}.{_interval_sentence(v)} Serve "
            f"without --speculative-config. {resolve}" + _split_sentence(rec.decomposition))


def _turn_on(rec: Recommendation, v: Verdict) -> str:
    how = ("the knee of the throughput/latency front" if v.chosen_by == "knee"
           else f"the highest throughput meeting {slo_text(rec.slos)}")
    text = (f"{v.subject} is {how} at concurrency {rec.concurrency}: "
            f"{v.subject_throughput:.1f} tok/s ({v.speedup:.2f}x the baseline's "
            f"{v.baseline_throughput:.1f}), mean TPOT {v.subject_tpot_ms:.1f} ms (baseline "
            f"{v.baseline_tpot_ms:.1f} ms).")
    if not v.baseline_meets_slos:
        text += f" The baseline itself misses {slo_text(rec.slos)}."
    if rec.speedup_tpot is not None and rec.speedup_tpot < 1.0:
        text += " It pays for the throughput with a higher per-token latency."
    text += _interval_sentence(v)
    if v.basis == Basis.INTERVAL_ABOVE:
        text += (f" Its gain is within the noise floor (\u00b1{v.noise_floor:.1%} of the "
                 "MADs), but where the interval is settled, it decides.")
    return text + _split_sentence(rec.decomposition)


_REASONS = {
    Basis.INTERVAL_OPEN: _no_measurable_difference,
    Basis.NO_BASELINE: _no_baseline,
    Basis.TOO_FEW_CONFIGS: _too_few_configs,
    Basis.NO_CONFIG_MEETS_SLOS: _nothing_meets_the_slos,
    Basis.NOTHING_BEATS_BASELINE: _nothing_beats_the_baseline,
    Basis.WITHIN_NOISE: _no_measurable_difference,
    Basis.INTERVAL_EQUIVALENT: _no_measurable_difference,
    Basis.INTERVAL_BELOW: _no_measurable_difference,
    Basis.BEYOND_NOISE: _turn_on,
    Basis.INTERVAL_ABOVE: _turn_on,
}


# --- the parts of a reason -------------------------------------------------------------------
def slo_text(slos: Mapping[str, float | None]) -> str:
    parts = []
    if slos.get("max_tpot_ms") is not None:
        parts.append(f"mean TPOT <= {slos['max_tpot_ms']:g} ms")
    if slos.get("max_ttft_ms") is not None:
        parts.append(f"p99 TTFT <= {slos['max_ttft_ms']:g} ms")
    return " and ".join(parts) or "no SLOs"


def _interval(iv: SpeedupInterval) -> intervals.Interval:
    return intervals.Interval(point=iv.point, lo=iv.lo, hi=iv.hi, confidence=iv.confidence,
                              n_a=iv.launches[0], n_b=iv.launches[1], df=iv.pool_df)


def _interval_sentence(v: Verdict) -> str:
    """The subject's speedup across launches, as the reason's sentence ("" without one)."""
    iv = v.interval
    if iv is None:
        return ""
    margin = intervals.percent(iv.margin)
    where = {intervals.ABOVE: "above 1.00x", intervals.BELOW: "below 1.00x",
             intervals.EQUIVALENT: f"within \u00b1{margin} of 1.00x",
             intervals.OPEN: "not settled: the interval holds 1.00x and reaches beyond "
                             f"\u00b1{margin}"}[iv.decision]
    return f" Across launches, {v.subject} over the baseline: {_interval(iv).text()}, {where}."


def _noise_words(v: Verdict) -> tuple[str, str]:
    """The noise a gain did not exceed, in words, and what would resolve a smaller one."""
    spread = v.noise_spread
    if v.noise in (None, Noise.UNMEASURED) or spread is None:
        return (f"the ±{UNMEASURED_NOISE:.0%} that single runs can differ by (spread not "
                f"measured)", "Rerun the study with --repeats 3 to measure the spread.")
    if v.noise == Noise.PAIRED_WINDOWS:
        return (f"the ±{spread:.1%} that its speedup moved by across the level's windows "
                "(the same requests as the baseline's)", "More measured requests per level "
                "(--requests-per-slot, --num-requests) and more launches (--repeats) narrow "
                "it; the verify command re-measures this config and the baseline.")
    if v.noise == Noise.UNSETTLED_WINDOWS:
        return (f"the ±{spread:.1%} that its one launch's windows moved by (they did not "
                "settle)", "The verify command re-measures this config and the baseline; "
                "more repeats (--repeats) measure it better.")
    if v.noise == Noise.SINGLE_RUN:
        return (f"the ±{spread:.1%} that one run of a speculative config can differ "
                "by here (it ran once; the largest spread of this level's repeated "
                f"speculative configs, at least {UNMEASURED_NOISE:.0%})",
                "The verify command re-measures this config and the baseline; more "
                "repeats (--repeats) measure its own spread.")
    return ((f"the measured run-to-run spread (±{spread:.1%})" if v.noise == Noise.MEASURED
             else f"the {MIN_DIFFERENCE:.0%} a difference must exceed to count (the measured "
                  f"spread, ±{spread:.1%}, is below that floor)"),
            "More repeats (--repeats) can resolve a smaller difference; the verify "
            "command re-measures this config and the baseline.")


def _windows_clause(v: Verdict, gain: float) -> tuple[str, bool]:
    """How far each launch's own windows spread, as a clause, and whether one did not settle
    (its figure then moved within one launch by its spread, and a single launch says less)."""
    if not v.windows:
        return "", False
    parts = [f"±{w.pct:.1f}% ({w.label}{'' if w.settled else ', not converged'})"
             for w in v.windows]
    unsettled = any(not w.settled or w.pct >= 100 * abs(gain) for w in v.windows)
    return f"; within one launch the windows spread {' and '.join(parts)}", unsettled


def _split_sentence(split: ConfigSplit | None) -> str:
    """The decomposition as the reason's last sentence: the line, and what the path costs,
    stated only where the path ratio differs from 1.00 by more than the noise (noise_floor,
    the rule a speedup must pass to count)."""
    if split is None:
        return ""
    path, spread = split.path_cost, split.path_cost_spread
    floor = noise_floor(None if spread is None or path <= 0 else spread / path)
    if abs(path - 1.0) <= floor:
        what = (f"the speculative engine path's own cost is not measurable: {path:.2f}x is "
                f"within the noise (\u00b1{floor:.0%}) of 1.00x")
    elif path < 1.0:
        what = f"the speculative engine path alone costs {1 - path:.0%} of the throughput"
    else:
        what = f"the speculative engine path alone gains {path - 1:.0%}"
    return f" {split_line(split)} ({what})."


def split_line(split: ConfigSplit) -> str:
    """A recommendation's split in one line, each ratio with its spread as the report's table
    shows it: "ngram k=3 window 1-3: 1.06x \u00b10.02 over plain = path 0.83x \u00b10.02 x
    speculation 1.28x \u00b10.04"."""
    total = ratio_text(split.total_speedup, split.total_speedup_spread)
    return f"{split.label}: {total} over plain = {split.split_text()}"

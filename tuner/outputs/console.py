"""Outputs stage, the console: the lines a person reads on the terminal. One line per finished
trial, the bar over a study's trials (a TTY only), the bench table, a recommendation in a few
lines, the policy summary, the replay's predicted table, `tuner verify`'s table; and the
headlines and policy rows the Markdown and HTML reports share with them. Numbers are written
as tuner.outputs.text writes them.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tuner.outputs import decision_words, drafter_k, verdicts, verification
from tuner.outputs.text import (
    LAUNCH_SPREAD_NOTE,
    launch_spread,
    ngram_path_note,
    num,
    signed_pct,
    table_line,
    times,
    with_noise,
    with_pm,
)
from tuner.records.decisions import StepCostFit
from tuner.records.policy import BreakEvenStatus, ConfigCurve, Figure, PolicyDocument
from tuner.records.predictions import PredictedRow, Row
from tuner.records.recommendations import Recommendation
from tuner.records.results import BenchResult
from tuner.records.selection import Choice
from tuner.records.verification import Verification

HEADLINES = {"recommend": "Turn on", "speculation_off": "Leave speculation off",
             "insufficient_data": "No recommendation yet"}


def trial_line(result: BenchResult, baseline: dict | None) -> str:
    """One line per finished trial: config, then per level the speedup over the baseline,
    throughput, TPOT and acceptance length, then the engine's start-up time."""
    base = {lv["concurrency"]: lv for lv in (baseline or {}).get("levels", [])}
    parts = []
    for lv in result.levels:
        b = base.get(lv.concurrency)
        speed = (times(lv.output_throughput / b["output_throughput"]) + " "
                 if b and b["output_throughput"] > 0 and result.config.method != "none" else "")
        acc = (f" acc {lv.spec_decode_acceptance_length:.2f}"
               if lv.spec_decode_acceptance_length is not None else "")
        parts.append(f"c={lv.concurrency} {speed}{lv.output_throughput:.1f} tok/s "
                     f"TPOT {lv.mean_tpot_ms:.1f} ms{acc}")
    start = _engine_start(result)
    return f"{result.config.label()}: " + " | ".join(parts) + (f" | {start}" if start else "")


def _engine_start(result: BenchResult) -> str | None:
    """"engine start 41 s"; None for a server the tuner did not start (`--base-url`)."""
    return f"engine start {result.engine.start_s:.0f} s" if result.engine.launched else None


class TrialProgress:
    """The bar over a study's engine launches, on a TTY: done/total, elapsed and ETA, the
    trial lines printed above it. Without a bar, `say` is the caller's own.

    `update(done, total)` takes absolute counts, so a resumed study starts its bar where the
    storage stands and the ETA counts only this run's pace (tqdm's `initial`)."""

    def __init__(self, *, say: Callable[[str], None], show_bar: bool, desc: str = "trials",
                 unit: str = "trial", refresh_s: float = 1.0) -> None:
        self._say, self.show_bar, self.desc, self.unit = say, show_bar, desc, unit
        self.refresh_s = refresh_s
        self.bar: Any = None
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def say(self, message: str) -> None:
        """A line above the bar (tqdm clears it, the line is written, the bar redrawn)."""
        self.write(self._say, message)

    def write(self, say: Callable[[str], None], message: str) -> None:
        """`say(message)` above the bar: for a writer other than the default one (-v's)."""
        if self.bar is None:
            say(message)
            return
        with self.bar.external_write_mode(file=sys.stderr):
            say(message)

    def update(self, done: int, total: int) -> None:
        if not self.show_bar:
            return
        if self.bar is None:
            try:
                from tqdm import tqdm
            except ImportError:
                self.show_bar = False
                return
            self.bar = tqdm(total=total, initial=done, desc=self.desc, unit=self.unit,
                            file=sys.stderr, dynamic_ncols=True, smoothing=0.5)
            # tqdm redraws only when counted; a trial runs for minutes, so a ticker keeps
            # the elapsed time moving between trials.
            self._ticker = threading.Thread(target=self._tick, name="trial-bar", daemon=True)
            self._ticker.start()
            return
        self.bar.total = total
        if done != self.bar.n:
            self.bar.update(done - self.bar.n)
        else:
            self.bar.refresh()

    def _tick(self) -> None:
        while not self._stop.wait(self.refresh_s):
            self.bar.refresh()

    def close(self) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def bench_table(result: BenchResult) -> str:
    """A fixed-width table of one bench run, a row per concurrency level."""
    head = ["conc", "ok/req", "out tok/s", "TPOT mean", "TPOT p50", "TPOT p99", "TTFT mean",
            "chunk ITL", "accept %", "accept len"]
    rows = []
    for lv in result.levels:
        rows.append([
            str(lv.concurrency), f"{lv.completed}/{lv.num_requests}",
            num(lv.output_throughput), num(lv.mean_tpot_ms), num(lv.median_tpot_ms),
            num(lv.p99_tpot_ms), num(lv.mean_ttft_ms), num(lv.mean_itl_ms),
            num(lv.spec_decode_acceptance_rate),  # already in percent, as vLLM's
            num(lv.spec_decode_acceptance_length, "{:.2f}"),
        ])
    if any(lv.converged is not None for lv in result.levels):  # measured in windows
        head.append("windows")
        for row, lv in zip(rows, result.levels, strict=True):
            row.append(lv.stability_text(lv.converged, lv.stability_pct) or "-")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    start = _engine_start(result)
    lines = [f"{result.label()}  ({start + '; ' if start else ''}latencies in ms)",
             "  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def recommendation_json(rec: Recommendation) -> str:
    """The recommendation as `tuner recommend --json` prints it: as recommendation.json holds
    each level, its fields and its words."""
    return json.dumps(verdicts.worded(rec).model_dump(mode="json"), indent=2)


def format_recommendation(rec: Recommendation) -> str:
    """A few terminal lines: the verdict, the numbers against the baseline, the command."""
    sel = rec.verdict.selection
    head = ("Undecided" if sel is not None and sel.choice == Choice.UNDECIDED
            else HEADLINES[rec.status] + (f" {rec.label}" if rec.status == "recommend" else ""))
    lines = [f"Concurrency {rec.concurrency}: {head}", f"  {verdicts.reason(rec)}"]
    m, b = rec.metrics, rec.baseline_metrics
    if rec.status == "recommend" and m:
        lines.append(
            f"  {num(m.get('output_throughput'))} tok/s ({times(rec.speedup_throughput)} baseline), "
            f"TPOT mean {num(m.get('mean_tpot_ms'))} / p99 {num(m.get('p99_tpot_ms'))} ms "
            f"(baseline {num(b.get('mean_tpot_ms'))}), TTFT {num(m.get('mean_ttft_ms'), '{:.0f}')}"
            f" ms, acceptance {num(m.get('spec_decode_acceptance_rate'), '{:.0f}%')} "
            f"(length {num(m.get('spec_decode_acceptance_length'), '{:.2f}')})")
    if sure := verdicts.confidence(rec):
        lines.append(f"  confidence: {sure}")
    if rec.serve_command:
        lines.append(f"  serve:  {rec.serve_command}")
    if rec.serve_note:
        lines.append(f"  note:   {rec.serve_note}")
    if rec.verify_command:
        lines.append(f"  verify: {rec.verify_command}")
    return "\n".join(lines)


def format_policy(policy: PolicyDocument) -> str:
    """Terminal lines: verdict, break-evens, the schedule and the serve command."""
    lines = ["Load-aware policy: " + (policy.headline or "")]
    for cfg in policy.configs:
        lines.append(f"  {cfg.label}: {break_even_text(cfg)}")
    lines.append(f"  K by measured concurrency: {policy.k_by_level}")
    if policy.schedule is None and policy.bands:
        # The method's proposer takes no changing K (the headline says why): bands, no schedule.
        lines.append(f"  schedule: none; bands (a static K each): {json.dumps(policy.bands)}")
    else:
        lines.append(f"  schedule: {json.dumps(policy.schedule)}")
    if policy.serve_command:
        lines.append(f"  serve:  {policy.serve_command}")
    if policy.serve_note:
        lines.append(f"  note:   {policy.serve_note}")
    for band in policy.fallback_bands or ():
        lines.append(f"  router band: {band}")
    lines += ["  " + line for line in open_loop_lines(policy)]
    head, rows = policy_rows(policy)
    lines.append("  speedup over baseline (median, noise):")
    lines.append("    " + " | ".join(head))
    lines += ["    " + " | ".join(r) for r in rows]
    return "\n".join(lines)


def open_loop_lines(policy: PolicyDocument) -> list[str]:
    """The open-loop check in words (tuner.analysis.open_loop.with_open_loop's figures): per band
    edge, the schedule's throughput against the best static K under Poisson arrivals there,
    and what changed where it dipped beyond the spread; [] where no check ran."""
    block = policy.open_loop
    if block is None:
        return []
    lines = ["open-loop check (Poisson arrivals; vLLM keys the schedule on scheduled requests, "
             "prefills included):"]
    for e in block.edges:
        head = (f"  edge {e.edge}/{e.edge + 1} (K {e.k_below} to {e.k_above}), "
                f"{e.rate:.2f} req/s, at most {e.concurrency} in flight: ")
        pol = e.policy
        best = None if e.best_k is None else e.static.get(e.best_k)
        if e.dips is None or pol is None or best is None or e.ratio is None \
                or e.noise is None:
            lines.append(head + "not measured (a run failed)")
            continue
        figures = (f"schedule {_tok(pol)} vs best static K={e.best_k} {_tok(best)} "
                   f"({e.ratio:.2f}x, spread ±{100 * e.noise:.0f}%)")
        lines.append(head + figures + (": dips beyond the spread" if e.dips
                                       else ": no dip beyond the spread"))
        if cost := e.gives_up:
            merged = cost.merged_speedup
            lines.append(f"    kept: merging into K={cost.merged_k} would give up the "
                         f"closed-loop {cost.speedup:.2f}x of K={cost.k} at concurrency "
                         f"{cost.concurrency} (" + ("not measured" if merged is None
                                                   else f"{merged:.2f}x") + ")")
    if block.revised:
        lines.append(f"  bands merged at the dipping edge(s) {list(block.dipped_at)} into the K "
                     f"that measured better there: schedule {json.dumps(block.schedule_revised)}"
                     f" (was {json.dumps(block.schedule_verified)}, verified on the ladder "
                     f"above)")
    elif not block.unmeasured_at and not block.kept_at:
        lines.append("  the schedule holds at every edge")
    return lines


def _tok(figure: Figure) -> str:
    tpot = figure.mean_tpot_ms
    return (f"{figure.throughput:.1f} ±{figure.spread:.1f} tok/s"
            + ("" if tpot is None else f" (TPOT {tpot:.1f} ms)"))


def policy_rows(policy: PolicyDocument) -> tuple[list[str], list[list[str]]]:
    ver = {r.concurrency: r for r in (policy.verification.rows if policy.verification else ())}
    head = ["concurrency"] + [c.label for c in policy.configs] + (["policy"] if ver else [])
    rows = []
    for c in policy.ladder:
        row = [str(c)]
        for cfg in policy.configs:
            st = cfg.stats.get(c)
            row.append("-" if not st else with_noise(st.speedup, st.noise))
        if ver:
            r = ver.get(c)
            row.append("-" if not r else with_noise(r.policy_speedup, r.policy_noise)
                       + (" (below baseline)" if r.below_baseline_beyond_noise else ""))
        rows.append(row)
    return head, rows


def break_even_text(cfg: ConfigCurve) -> str:
    be = cfg.break_even
    if be is None:
        return "not measured"
    if be.status is BreakEvenStatus.ALWAYS_PAYS:
        return f"pays at every measured level (up to {be.last_paying})"
    if be.status is BreakEvenStatus.NEVER_PAYS:
        return "does not pay beyond the noise even at the lowest level"
    return (f"break-even at concurrency ~{be.concurrency:.1f} (pays at "
            f"{be.last_paying}, not at {be.first_not_paying})")


# --- the replay's predicted table -----------------------------------------------------------
SAMPLED_NOTE = ("The baseline sampled (temperature > 0): each \u00b1 is the half-width of a 90% "
                "interval for what a measured run of as many requests would show, from "
                "resampling the baseline's requests; throughput and TPOT carry it through "
                "tokens per step.")


def ranked_predictions(rows: Iterable[Row]) -> list[Row]:
    """The speculative predicted rows (tuner.replay.predict's or a traffic's), best first:
    by predicted throughput, then (for rows the step cost cannot price yet) by acceptance
    length; unknown figures last."""
    def rank(r: Row) -> tuple:
        thr, acc = _finite(r.pred_output_throughput), _finite(r.acceptance_length)
        return (thr is None, -(thr or 0.0), acc is None, -(acc or 0.0), str(r.label))

    return sorted((r for r in rows if r.method != "none"), key=rank)


def predict_table(rows: Sequence[PredictedRow], *, top: int = 10,
                  levels: list[int] | None = None) -> str:
    """The replay's predicted table, a block per level: the baseline, then the `top` configs
    by predicted throughput, with measured throughput and the prediction's error where the
    study measured the config. Rows are those of tuner.replay.predict (or predicted.csv)."""
    if not rows:
        return "Nothing predicted: the study needs a baseline with captured tokens."
    present = sorted({r.concurrency for r in rows})
    head = ["config", "acc len", "pred tok/s", "pred TPOT ms", "pred TTFT ms", "speedup",
            "meas tok/s", "err", "spread"]
    blocks, in_sample, sampled, any_measured = [], False, False, False
    for c in levels or present:
        at = [r for r in rows if r.concurrency == c]
        spec = ranked_predictions(at)
        if not at:
            blocks.append(f"Concurrency {c}: nothing predicted at this level.")
            continue
        priced = any(_finite(r.pred_output_throughput) is not None for r in spec)
        order = "predicted throughput" if priced else (
            "acceptance length (no speculative launch calibrates the step cost yet)")
        table = []
        for r in [r for r in at if r.method == "none"][:1] + spec[:max(top, 0)]:
            measured = r.measured_trials > 0
            any_measured |= measured
            in_sample |= r.calibration and r.method != "none"
            sampled |= _finite(r.acceptance_length_pm) is not None
            table.append([
                r.label + (" *" if r.calibration and r.method != "none" else ""),
                with_pm(r.acceptance_length, r.acceptance_length_pm, "{:.2f}"),
                with_pm(r.pred_output_throughput, r.pred_output_throughput_pm),
                with_pm(r.pred_mean_tpot_ms, r.pred_mean_tpot_ms_pm),
                num(r.pred_mean_ttft_ms, "{:.0f}"),
                times(r.pred_speedup),
                num(r.meas_output_throughput) if measured else "",
                signed_pct(r.err_output_throughput_pct) if measured else "",
                launch_spread(r) if measured else ""])
        widths = [max(len(h), *(len(row[i]) for row in table)) for i, h in enumerate(head)]
        blocks.append("\n".join(
            [f"Concurrency {c}: {len(spec)} configs predicted; top {min(len(spec), top)} by "
             f"{order}", table_line(head, widths), table_line(["-" * w for w in widths], widths)]
            + [table_line(row, widths) for row in table]))
    if in_sample:
        blocks.append("* calibration launch: the step cost was fitted on it, so its error is "
                      "in-sample.")
    if sampled:
        blocks.append(SAMPLED_NOTE)
    if any_measured:
        blocks.append(LAUNCH_SPREAD_NOTE)
    if (note := ngram_path_note(rows)) is not None:
        blocks.append(note)
    return "\n\n".join(blocks)


def _finite(value: Any) -> float | None:
    """A number as float, or None for None, NaN, infinities and anything not a number."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def verification_table(v: Verification) -> str:
    """What `tuner verify` prints: a row per level and one sentence each
    (tuner.outputs.verification)."""
    return verification.table(v)


def drafter_axes_text(axes: Sequence[Any]) -> str:
    """Every model-based drafter's K axis (tuner.records.drafter_k.DrafterAxis), as
    tuner.outputs.drafter_k writes it; "" for none."""
    return drafter_k.axes_text(axes)


def step_cost_text(fit: StepCostFit) -> str:
    """A level's step cost in one line, as the study's decisions word it (`tuner predict`)."""
    return decision_words.step_cost_text(fit)

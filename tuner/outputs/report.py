"""Outputs stage, the report: recommendation.json, trials.csv, trials_raw.csv, report.md and a
self-contained report.html, rendered from what the analysis computed (tuner.api.report runs the
analysis on the study's storage and hands the frames here), so every file can be regenerated.

Each level's serve flags are also written as a `vllm serve --config` YAML file
(vllm_config_c<level>.yaml, listed in recommendation.json). The replay's predictions
(tuner.outputs.predictions) and the engine path / speculation split of a study with an aligned
baseline (tuner.outputs.split_table) have their own sections.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.outputs import decisions, files, split_table, verdicts
from tuner.outputs.console import HEADLINES, break_even_text, open_loop_lines, policy_rows
from tuner.outputs.predictions import PREDICTED_CSV, load_predictions, prediction_tables
from tuner.outputs.text import num, times
from tuner.records.configs import RequestSchedule
from tuner.records.policy import PolicyDocument
from tuner.records.predictions import PredictionMiss
from tuner.records.results import LevelMetrics
from tuner.records.storage import StudySettings

if TYPE_CHECKING:
    import pandas as pd

    from tuner.analysis.pareto import Points
    from tuner.records.recommendations import Recommendation


# --- study outputs, regenerated from storage ----------------------------------------------

_METRIC_ROWS = (("output_throughput", "output throughput (tok/s)", "{:.1f}"),
                ("mean_tpot_ms", "mean TPOT (ms)", "{:.1f}"),
                ("p99_tpot_ms", "p99 TPOT (ms)", "{:.1f}"),
                ("mean_ttft_ms", "mean TTFT (ms)", "{:.0f}"),
                ("p99_ttft_ms", "p99 TTFT (ms)", "{:.0f}"),
                ("spec_decode_acceptance_rate", "acceptance rate (%)", "{:.0f}%"),
                ("spec_decode_acceptance_length", "mean acceptance length (tokens/step)",
                 "{:.2f}"))


def write_outputs(*, study_name: str, df: pd.DataFrame, configs: pd.DataFrame, points: Points,
                  recs: Sequence[Recommendation], out_dir: Path, settings: StudySettings
                  ) -> dict[str, Path]:
    """Write trials.csv (`configs`: a row per config and level), trials_raw.csv (`df`: a row per
    trial and level), recommendation.json, the plots and the split's table (`points`: the
    measured points, tuner.analysis.pareto.points), report.md and report.html.

    The caller computed the analysis from the study's storage (tuner.api.report), so this runs
    as well on a finished study as on one still running or whose driver was killed. A
    policy.json and a predicted.csv (the replay's predictions) in `out_dir` are shown too.
    Returns {name: path}.
    """
    from tuner.outputs import plots

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    df, configs = with_reasons(df), with_reasons(configs)
    workload = settings.workload.name
    predictions = load_predictions(out_dir)
    drawn, notes = plots.draw_all(points, out_dir / "plots", workload=workload,
                                  recommendations=recs, predictions=predictions)
    policy = _load_policy(out_dir)
    if policy:
        drawn["policy"] = plots.policy_plot(policy, out_dir / "plots", notes=notes)
    doc = _Doc(study_name=study_name, settings=settings, df=df, recs=list(recs), plots=drawn,
               notes=notes, out_dir=out_dir)
    doc.policy, doc.predictions = policy, predictions
    doc.split_table = split_table.table(points.measured, recs)
    doc.decisions = decisions.decision_rows(decisions.load_decisions(out_dir))
    doc.config_files = write_serve_configs(recs, out_dir, env=settings.engine_spec.env)
    paths = {
        # Each config once, repeats pooled; every trial (copies answered from storage too)
        # stays in trials_raw.csv for whoever wants the single measurements.
        "trials_csv": files.write_atomic(out_dir / "trials.csv", _csv_text(configs)),
        "trials_raw_csv": files.write_atomic(out_dir / "trials_raw.csv", _csv_text(df)),
        "recommendation_json": files.write_atomic(
            out_dir / "recommendation.json", json.dumps(doc.summary(), indent=2) + "\n"),
        "report_md": files.write_atomic(out_dir / "report.md", doc.markdown()),
        "report_html": files.write_atomic(out_dir / "report.html", doc.html()),
    }
    if predictions is not None:
        paths["predicted_csv"] = out_dir / PREDICTED_CSV
    for drawn_files in drawn.values():
        paths.update({f"plot_{p.stem}": p for p in drawn_files})
    paths.update({f"serve_config_c{c}": p for c, p in doc.config_files.items()})
    return paths


def serve_config_name(concurrency: int) -> str:
    return f"vllm_config_c{concurrency}.yaml"


def write_serve_configs(recs: Sequence[Recommendation], out_dir: Path, *,
                        env: Mapping[str, str]) -> dict[int, Path]:
    """Each level's serve flags as a `vllm serve --config` YAML file ({level: path}); a level
    with nothing to serve writes none, and a file left by an earlier report is removed, so
    the folder never offers a config the data no longer supports."""
    import yaml

    written = {}
    for rec in recs:
        path = Path(out_dir) / serve_config_name(rec.concurrency)
        if rec.serve_config is None:
            path.unlink(missing_ok=True)
            continue
        lines = [f"# Concurrency {rec.concurrency}: {HEADLINES[rec.status]}"
                 + (f" {rec.label}" if rec.status == "recommend" else "") + ".",
                 f"# Serve with: vllm serve --config {path.name}"]
        if rec.serve_note:
            lines.append(f"# Note: {rec.serve_note}.")
        if env:
            lines.append("# Measured with the environment: "
                         + " ".join(f"{k}={v}" for k, v in sorted(env.items())))
        text = "\n".join(lines) + "\n" + yaml.safe_dump(rec.serve_config, sort_keys=False)
        written[rec.concurrency] = files.write_atomic(path, text)
    return written


# The reason column's words for a trial without a failure text of its own.
_STATE_REASONS = {
    "RUNNING": "not finished: still running, or the driver was stopped (rerun the same "
               "command to resume)",
    "WAITING": "queued, not started yet",
    "PRUNED": "pruned by the sampler before it was measured",
}
_NO_FAILURE_TEXT = "failed without a recorded reason"
_NO_RESULT = "completed without a stored result (nothing to analyse)"


def with_reasons(df: pd.DataFrame) -> pd.DataFrame:
    """`df` (a trials_frame, or its configs_frame) with its reason column in words: a failed
    trial's own text, else what its state says (tuner.analysis.frame keeps the failure's text
    only)."""
    import pandas as pd

    if df.empty or "reason" not in df.columns:
        return df
    out = df.copy()

    def words(state: Any, reason: Any, concurrency: Any) -> Any:
        if state == "FAIL":
            return reason if isinstance(reason, str) and reason else _NO_FAILURE_TEXT
        if state in _STATE_REASONS:
            return _STATE_REASONS[state]
        if state == "COMPLETE" and pd.isna(concurrency):
            return _NO_RESULT
        return reason

    out["reason"] = [words(*cells) for cells in zip(
        out["state"], out["reason"], out["concurrency"], strict=True)]
    return out


def _csv_text(df: pd.DataFrame) -> str:
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            out[col] = out[col].map(
                lambda v: json.dumps(list(v)) if isinstance(v, (list, tuple)) else v)
    return out.to_csv(index=False)


def _schedule_text(plan: RequestSchedule | None) -> str:
    """The request schedule every launch sent, as the report's context says it."""
    if plan is None:
        return "not recorded (a study stored before the request schedule)"
    levels = ", ".join(f"c={lv.concurrency}: {len(lv.warmups)} warm-up(s) + "
                       f"{len(lv.measured)} measured"
                       + (f" (shortened from {lv.asked})" if lv.asked else "")
                       for lv in plan.levels)
    if plan.allow_repeats:
        return (f"{plan.requests}, the same in every launch ({levels}); --allow-repeats: "
                f"prompts may repeat within a launch, and suffix decoding and the prefix cache "
                f"learn from the repeats")
    return f"{plan.requests}, the same in every launch, no prompt twice ({levels})"


class _Doc:
    """The content of one report, rendered as JSON summary, Markdown or HTML."""

    def __init__(self, *, study_name: str, settings: StudySettings, df: pd.DataFrame,
                 recs: list[Recommendation], plots: dict[str, list[Path]], notes: list[str],
                 out_dir: Path) -> None:
        self.study_name, self.settings, self.df, self.recs = study_name, settings, df, recs
        self.plots, self.notes, self.out_dir = plots, notes, out_dir
        every = df.drop_duplicates("trial")
        # Proposals answered from storage measured nothing: counted apart, listed nowhere.
        trials = every[every["duplicate_of"].isna()]
        self.copies = len(every) - len(trials)
        self.counts = {s.lower(): int((trials["state"] == s).sum())
                       for s in ("COMPLETE", "FAIL", "RUNNING", "WAITING", "PRUNED")}
        self.unfinished = trials[trials["state"].isin(["RUNNING", "WAITING"])]
        self.failed = trials[trials["state"] == "FAIL"]
        fp, engine = settings.fingerprint, settings.engine_spec
        # As the user named it; the fingerprint keeps the resolved path.
        model = engine.model_name or fp.model or engine.model
        # A local path is named by its folder; a hub id (org/name) is shown whole.
        local = model.startswith(("/", ".", "~"))
        self.model = (model.rstrip("/").rsplit("/", 1)[-1] if local else model) or model
        self.workload = settings.workload.name
        self.device = fp.device or engine.device
        self.levels = sorted({int(c) for c in df["concurrency"].dropna()})
        self.chosen = {r.trial for r in recs if r.status == "recommend"}
        self.policy: PolicyDocument | None = None
        self.predictions: pd.DataFrame | None = None
        self.decisions: list[tuple[str, list[str]]] = []  # "How it was decided"
        # The engine path / speculation table (tuner.outputs.split_table.table)
        self.split_table: tuple[list[str], list[list[str]]] | None = None
        self.config_files: dict[int, Path] = {}

    # --- shared content -------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """recommendation.json: the study, its settings and each level's WordedRecommendation."""
        s = self.settings
        return {"study": self.study_name, "complete": self.unfinished.empty,
                "trials": {**self.counts, "answered_from_storage": self.copies},
                "fingerprint": s.fingerprint.model_dump(mode="json"),
                "workload": s.workload.model_dump(mode="json"),
                "workload_digest": s.workload_digest, "objectives": list(s.objectives),
                "target_concurrency": s.target_concurrency, "constraints": dict(s.constraints),
                "levels": [{**verdicts.worded(r).model_dump(mode="json"), "serve_config_file": (
                    self.config_files[r.concurrency].name
                    if r.concurrency in self.config_files else None)} for r in self.recs],
                "serve_config_files": {str(c): p.name for c, p in self.config_files.items()},
                "policy": _policy_summary(self.policy)}

    def title(self) -> str:
        return f"Speculative decoding for {self.model} on {self.workload}"

    def subtitle(self) -> str:
        c = self.counts
        return (f"{self.device}, vLLM {self.settings.fingerprint.vllm or '?'}; study {self.study_name}: "
                f"{c['complete']} completed, {c['fail']} failed, "
                f"{c['running'] + c['waiting']} unfinished trial(s)"
                + (f"; {self.copies} proposal(s) of a config already measured or refused "
                   f"answered from storage." if self.copies else "."))

    def incomplete_note(self) -> str | None:
        if self.unfinished.empty:
            return None
        nums = ", ".join(str(t) for t in self.unfinished["trial"])
        return (f"This study is incomplete: trial(s) {nums} have not finished (still running, "
                f"or the driver was stopped). The figures below cover completed trials only; "
                f"rerun the same command to resume, then regenerate this report.")

    def context_rows(self) -> list[tuple[str, str]]:
        s = self.settings
        stored = s.stored()
        rows = [(k, str(v)) for k, v in stored["fingerprint"].items()]
        named = s.engine_spec.model_name
        if named and named != s.fingerprint.model:
            rows.append(("model as named (serve commands)", named))
        rows.append(("workload spec", json.dumps(stored["workload"], sort_keys=True)))
        rows.append(("search space", s.space))
        rows.append(("objectives", ", ".join(s.objectives)))
        rows.append(("target concurrency", str(s.target_concurrency)))
        rows.append(("concurrency levels", ", ".join(map(str, self.levels)) or "-"))
        rows.append(("requests per launch", _schedule_text(s.schedule)))
        rows.append(("SLOs", ", ".join(f"{k}={v}" for k, v in s.constraints.items()
                                       if v is not None) or "none (knee of the front)"))
        extra = s.engine_spec.extra_args
        if extra:
            rows.append(("engine arguments", " ".join(map(str, extra))))
        return rows

    def trial_rows(self) -> tuple[list[str], list[list[str]]]:
        from tuner.analysis.frame import with_medians

        head = ["trial", "state", "role", "config", "runs"]
        for c in self.levels:
            head += [f"c={c} tok/s", f"c={c} TPOT ms", f"c={c} speedup",
                     f"c={c} accept len (rate)"]
        robust = with_medians(self.df[self.df["duplicate_of"].isna()])
        rows = []
        for trial, group in robust.groupby("trial", sort=True):
            first = group.iloc[0]
            label = str(first["label"]) + (" \u2605" if trial in self.chosen else "")
            row = [str(trial), str(first["state"]), str(first["role"]), label,
                   "-" if _isna(first["n_measurements"]) else str(first["n_measurements"])]
            for c in self.levels:
                lv = group[group["concurrency"] == c]
                if lv.empty:
                    row += ["-"] * 4
                    continue
                r = lv.iloc[0]
                acc = num(r["spec_decode_acceptance_length"], "{:.2f}")
                if acc != "-":
                    acc += f" ({num(r['spec_decode_acceptance_rate'], '{:.0f}%')})"
                row += [num(r["output_throughput"], "{:.1f}") + _steadiness(r),
                        num(r["mean_tpot_ms"], "{:.1f}"), times(r["speedup_throughput"]), acc]
            rows.append(row)
        return head, rows

    def plot_groups(self) -> list[tuple[str, list[Path]]]:
        return [("Pareto fronts", self.plots.get("pareto", [])),
                ("Load-aware policy: speedup against concurrency", self.plots.get("policy", [])),
                ("Speedup against concurrency", self.plots.get("speedup", [])),
                ("Acceptance", self.plots.get("acceptance", []) + self.plots.get(
                    "per_position", []))]

    # --- Markdown ---------------------------------------------------------------------------
    def markdown(self) -> str:
        e = _md
        out = [f"# {e(self.title())}", "", e(self.subtitle()), ""]
        if self.incomplete_note():
            out += [f"> **Incomplete:** {e(self.incomplete_note())}", ""]
        out += ["## Recommendation", ""]
        for rec in self.recs:
            out += self._md_rec(rec)
        if self.split_table:
            out += ["## Engine path and speculation", "", e(split_table.INTRO), "",
                    *_md_table(*self.split_table), ""]
        out += policy_markdown(self.policy, self.out_dir)
        out += ["## What was tuned, on what", "", "| | |", "|---|---|"]
        out += [f"| {e(k)} | {e(v)} |" for k, v in self.context_rows()]
        out.append("")
        for title, pngs in self.plot_groups():
            if pngs:
                out += [f"## {title}", ""]
                out += [f"![{e(p.stem)}]({p.relative_to(self.out_dir).as_posix()})" for p in pngs]
                out.append("")
        if self.notes:
            out += ["Plots left out:", ""] + [f"- {e(n)}" for n in self.notes] + [""]
        out += self._md_decisions() + self._md_predictions()
        out += ["## Trials", "", "Values are medians where a config was measured more than once;"
                " \u2605 marks a recommended config.", "", *_md_table(*self.trial_rows()), ""]
        if not self.failed.empty:
            out += ["## Failures", ""]
            for _, t in self.failed.iterrows():
                out += [f"- **Trial {t['trial']}** ({e(t['label'])}), "
                        f"{e(t['failure_kind'] or 'failed')}: {e(t['reason'])}", ""]
                if t["log_tail"]:
                    out += [_fence(str(t["log_tail"]), indent="  "), ""]
        return "\n".join(out)

    def _md_rec(self, rec: Recommendation) -> list[str]:
        e = _md
        head = HEADLINES[rec.status] + (f": {rec.label}" if rec.status == "recommend" else "")
        out = [f"### Concurrency {rec.concurrency} \u2014 {e(head)}", "", e(verdicts.reason(rec)), ""]
        out += [f"**{e(m.text())}**\n" for m in self._misses(rec)]
        if rec.serve_command:
            out += [_fence(rec.serve_command), ""]
        if rec.serve_note:
            out += [f"Note: {e(rec.serve_note)}.", ""]
        if rec.concurrency in self.config_files:
            out += [f"Or `vllm serve --config {self.config_files[rec.concurrency].name}`.", ""]
        split = split_table.rec_rows(rec.decomposition)
        if split:
            out += [f"| {e(rec.decomposition.label)} | |", "|---|---:|"]
            out += [f"| {e(k)} | {e(v)} |" for k, v in split]
            out.append("")
        if rec.metrics or rec.baseline_metrics:
            out += ["| metric | this config | baseline |", "|---|---:|---:|"]
            for key, name, fmt in _METRIC_ROWS:
                out.append(f"| {name} | {num(rec.metrics.get(key), fmt)} | "
                           f"{num(rec.baseline_metrics.get(key), fmt)} |")
            out.append("")
        if sure := verdicts.confidence(rec):
            out += [f"Confidence: {e(sure)}", ""]
        if rec.verify_command:
            out += ["Verify:", "", _fence(rec.verify_command), ""]
        return out

    def _md_decisions(self) -> list[str]:
        if not self.decisions:
            return []
        e = _md
        out = ["## How it was decided", "", e(decisions.INTRO), ""]
        for title, texts in self.decisions:
            if len(texts) == 1:
                out += [f"- **{e(title)}:** {e(texts[0])}"]
            else:
                out += [f"- **{e(title)}:**"] + [f"  - {e(t)}" for t in texts]
        return [*out, ""]

    def _md_predictions(self) -> list[str]:
        intro, tables = prediction_tables(self.predictions)
        if not intro:
            return []
        out = ["## Predicted by replay", ""]
        for text in intro:
            out += [_md(text), ""]
        for title, head, rows in tables:
            out += [f"### {_md(title)}", "", *_md_table(head, rows), ""]
        return out

    # --- HTML -------------------------------------------------------------------------------
    def html(self) -> str:
        e = html.escape
        body = [f"<h1>{e(self.title())}</h1>", f"<p class='sub'>{e(self.subtitle())}</p>"]
        if self.incomplete_note():
            body.append(f"<p class='warn'><b>Incomplete.</b> {e(self.incomplete_note())}</p>")
        body.append("<h2>Recommendation</h2>")
        for rec in self.recs:
            body.append(self._html_rec(rec))
        if self.split_table:
            body.append("<h2>Engine path and speculation</h2>"
                        f"<p class='sub'>{e(split_table.INTRO)}</p>"
                        + _html_table(*self.split_table))
        body.append(policy_html(self.policy))
        body.append("<h2>What was tuned, on what</h2><table class='kv'>")
        body += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in self.context_rows()]
        body.append("</table>")
        for title, pngs in self.plot_groups():
            if pngs:
                body.append(f"<h2>{e(title)}</h2>")
                body += [f"<img alt='{e(p.stem)}' src='data:image/png;base64,"
                         f"{base64.b64encode(p.read_bytes()).decode()}'>" for p in pngs]
        if self.notes:
            body.append("<p class='sub'>Plots left out: " + "; ".join(map(e, self.notes))
                        + "</p>")
        if self.decisions:
            body.append("<h2>How it was decided</h2>"
                        f"<p class='sub'>{e(decisions.INTRO)}</p><table class='kv decided'>"
                        + "".join(f"<tr><th>{e(title)}</th><td>" + "".join(
                            f"<p>{e(t)}</p>" for t in texts) + "</td></tr>"
                            for title, texts in self.decisions) + "</table>")
        intro, tables = prediction_tables(self.predictions)
        if intro:
            body.append("<h2>Predicted by replay</h2>" + "".join(f"<p>{e(t)}</p>" for t in intro))
            body += [f"<h3>{e(title)}</h3>" + _html_table(head, rows)
                     for title, head, rows in tables]
        body += self._html_trials()
        return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
                f"<title>{e(self.title())}</title><style>{_CSS}</style></head><body>"
                + "\n".join(body) + "</body></html>\n")

    def _html_trials(self) -> list[str]:
        """The trials table, a row per trial coloured by state, then each failure's log."""
        e = html.escape
        head, rows = self.trial_rows()
        body = ["<h2>Trials</h2><p class='sub'>Values are medians where a config was "
                "measured more than once; \u2605 marks a recommended config.</p>"
                "<div class='scroll'><table class='trials'><tr>"
                + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"]
        for r in rows:
            cls = {"FAIL": "fail", "RUNNING": "run", "WAITING": "run"}.get(r[1], "")
            body.append(f"<tr class='{cls}'>" + "".join(
                f"<td class='cfg'>{e(c)}</td>" if i == 3 else f"<td>{e(c)}</td>"
                for i, c in enumerate(r)) + "</tr>")
        body.append("</table></div>")
        if not self.failed.empty:
            body.append("<h2>Failures</h2>")
            for _, t in self.failed.iterrows():
                body.append(
                    f"<details><summary>Trial {t['trial']} ({e(str(t['label']))}): "
                    f"<b>{e(str(t['failure_kind'] or 'failed'))}</b> \u2014 "
                    f"{e(str(t['reason']))}</summary><pre>{e(str(t['log_tail'] or '(no log)'))}"
                    f"</pre></details>")
        return body

    def _misses(self, rec: Recommendation) -> list[PredictionMiss]:
        """Every launched config at the recommendation's level whose acceptance the replay
        missed beyond its stated accuracy, the chosen one's already in its reason."""
        said = {m.key for m in rec.prediction_misses}
        return [m for m in self.settings.misses_at(rec.concurrency) if m.key not in said]

    def _html_rec(self, rec: Recommendation) -> str:
        e = html.escape
        head = HEADLINES[rec.status] + (f": {rec.label}" if rec.status == "recommend" else "")
        parts = [f"<div class='rec {rec.status}'><h3>Concurrency {rec.concurrency} \u2014 "
                 f"{e(head)}</h3><p>{e(verdicts.reason(rec))}</p>"]
        parts += [f"<p class='miss'><strong>{e(m.text())}</strong></p>"
                  for m in self._misses(rec)]
        if rec.serve_command:
            parts.append(f"<pre class='cmd'>{e(rec.serve_command)}</pre>")
        if rec.serve_note:
            parts.append(f"<p>Note: {e(rec.serve_note)}.</p>")
        if rec.concurrency in self.config_files:
            parts.append(f"<p>Or <code>vllm serve --config "
                         f"{e(self.config_files[rec.concurrency].name)}</code>.</p>")
        split = split_table.rec_rows(rec.decomposition)
        if split:
            parts.append(f"<table class='split'><tr><th colspan='2'>"
                         f"{e(rec.decomposition.label)}</th></tr>" + "".join(
                             f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in split)
                         + "</table>")
        if rec.metrics or rec.baseline_metrics:
            parts.append("<table><tr><th>metric</th><th>this config</th><th>baseline</th></tr>")
            for key, name, fmt in _METRIC_ROWS:
                parts.append(f"<tr><td>{e(name)}</td><td>{num(rec.metrics.get(key), fmt)}</td>"
                             f"<td>{num(rec.baseline_metrics.get(key), fmt)}</td></tr>")
            parts.append("</table>")
        if sure := verdicts.confidence(rec):
            parts.append(f"<p><b>Confidence:</b> {e(sure)}</p>")
        if rec.verify_command:
            parts.append(f"<p>Verify:</p><pre class='cmd'>{e(rec.verify_command)}</pre>")
        return "".join(parts) + "</div>"


def _steadiness(row: pd.Series) -> str:
    """' (±1.2%)' or ' (not converged ±6.1%)' after a level measured in windows, else ''."""
    converged, pct = row.get("converged"), row.get("stability_pct")
    text = LevelMetrics.stability_text(None if _isna(converged) else bool(converged),
                                       None if _isna(pct) else float(pct))
    return f" ({text})" if text else ""


def _isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value)) if not isinstance(value, (list, tuple)) else False


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, every cell escaped (_md)."""
    return ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(_md(c) for c in r) + " |" for r in rows)]


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A wide table that scrolls, its first column a config (which wraps; figures do not)."""
    e = html.escape
    return ("<div class='scroll'><table class='trials'><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr><td class='cfg'>" + e(r[0]) + "</td>"
                      + "".join(f"<td>{e(c)}</td>" for c in r[1:]) + "</tr>" for r in rows)
            + "</table></div>")


def _md(text: Any) -> str:
    """Markdown text cell: HTML-escaped (renderers pass raw HTML through) and pipe-safe."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _fence(text: str, *, indent: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return "\n".join(indent + line for line in [ticks, *text.splitlines(), ticks])


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:1px solid #ddd}
.sub{color:#555}.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.6em 1em}
.rec{border:1px solid #ddd;border-left:6px solid #888;padding:.4em 1em;margin:1em 0}
.rec.recommend{border-left-color:#2a9d4b}.rec.speculation_off{border-left-color:#3b6fd8}
.rec.insufficient_data{border-left-color:#d08a1a}
pre{background:#f5f5f5;padding:.6em;overflow-x:auto;white-space:pre-wrap;word-break:break-all}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ddd;padding:.25em .5em;
text-align:left;font-size:.92em}.trials td{white-space:nowrap}
.trials td.cfg{white-space:normal;min-width:14em}.scroll{overflow-x:auto}
tr.fail td{background:#fdecec}tr.run td{background:#fff8e1}
img{max-width:100%;display:block;margin:1em 0}details{margin:.5em 0}
summary{cursor:pointer}.kv th{background:#fafafa;width:14em}
.decided td p{margin:.15em 0}
"""


# --- load-aware policy ----------------------------------------------------------------------
def _load_policy(out_dir: Path) -> PolicyDocument | None:
    """policy.json as the record it was written from (tuner.api.policy); None where there is
    none, or it cannot be read."""
    path = Path(out_dir) / "policy.json"
    try:
        return PolicyDocument.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


def _policy_summary(policy: PolicyDocument | None) -> dict[str, Any] | None:
    """The policy's part of recommendation.json."""
    if not policy:
        return None
    keys = ("headline", "method", "chosen", "ladder", "repeats", "schedule", "speculative_config",
            "serve_command", "serve_note", "fallback_bands", "schedule_problems")
    out = policy.model_dump(include=set(keys))
    out = {k: out.get(k) for k in keys}
    out["break_even"] = {c.label: None if c.break_even is None else c.break_even.model_dump()
                         for c in policy.configs}
    ver = policy.verification
    out["verification"] = (None if ver is None or ver.engine_rejected
                           else [r.model_dump() for r in ver.rows])
    return out


def policy_markdown(policy: PolicyDocument | None, out_dir: Path) -> list[str]:
    if not policy:
        return []
    e = _md
    out = ["## Load-aware policy", "", e(policy.headline or ""), ""]
    out += [f"- {e(c.label)}: {e(break_even_text(c))}" for c in policy.configs]
    out.append("")
    if policy.speculative_config:
        out += ["`--speculative-config` with the per-batch-size schedule:", "",
                _fence(json.dumps(policy.speculative_config)), ""]
    if policy.serve_command:
        out += [_fence(policy.serve_command), ""]
    if policy.serve_note:
        out += [f"Note: {e(policy.serve_note)}.", ""]
    if policy.fallback_bands:
        out += ["Band table for a router:", ""] + [f"- {e(b)}" for b in policy.fallback_bands]
        out.append("")
    if lines := open_loop_lines(policy):
        out += [e(lines[0]), ""] + [f"- {e(line.strip())}" for line in lines[1:]] + [""]
    head, rows = policy_rows(policy)
    out += ["| " + " | ".join(e(h) for h in head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(e(c) for c in r) + " |" for r in rows]
    out.append("")
    return out


def policy_html(policy: PolicyDocument | None) -> str:
    if not policy:
        return ""
    e = html.escape
    parts = ["<h2>Load-aware policy</h2>", f"<p><b>{e(policy.headline or '')}</b></p>",
             "<ul>"]
    parts += [f"<li>{e(c.label)}: {e(break_even_text(c))}</li>" for c in policy.configs]
    parts.append("</ul>")
    if policy.speculative_config:
        parts.append("<p>--speculative-config with the per-batch-size schedule:</p><pre>"
                     + e(json.dumps(policy.speculative_config)) + "</pre>")
    if policy.serve_command:
        parts.append(f"<pre>{e(policy.serve_command)}</pre>")
    if policy.serve_note:
        parts.append(f"<p>Note: {e(policy.serve_note)}.</p>")
    if policy.fallback_bands:
        parts.append("<p>Band table for a router:</p><ul>" + "".join(
            f"<li>{e(b)}</li>" for b in policy.fallback_bands) + "</ul>")
    if lines := open_loop_lines(policy):
        parts.append(f"<p>{e(lines[0])}</p><ul>" + "".join(
            f"<li>{e(line.strip())}</li>" for line in lines[1:]) + "</ul>")
    head, rows = policy_rows(policy)
    parts.append("<table class='trials'><tr>" + "".join(f"<th>{e(h)}</th>" for h in head)
                 + "</tr>" + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>"
                                     for r in rows) + "</table>")
    return "\n".join(parts)

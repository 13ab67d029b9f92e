"""Outputs stage, report.md: the report's content (tuner.outputs.report_content) in Markdown,
every cell escaped, the load-aware policy's section included.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.outputs import decisions, split_table, verdicts
from tuner.outputs.console import HEADLINES, break_even_text, open_loop_lines, policy_rows
from tuner.outputs.predictions import prediction_tables
from tuner.outputs.report_content import METRIC_ROWS, ReportContent
from tuner.outputs.text import num
from tuner.records.policy import PolicyDocument

if TYPE_CHECKING:
    from tuner.records.recommendations import Recommendation


def render(doc: ReportContent) -> str:
    """report.md's text."""
    e = _md
    out = [f"# {e(doc.title())}", "", e(doc.subtitle()), ""]
    if doc.incomplete_note():
        out += [f"> **Incomplete:** {e(doc.incomplete_note())}", ""]
    out += ["## Recommendation", ""]
    for rec in doc.recs:
        out += _rec(doc, rec)
    if doc.split_table:
        out += ["## Engine path and speculation", "", e(split_table.INTRO), "",
                *_md_table(*doc.split_table), ""]
    out += policy_markdown(doc.policy, doc.out_dir)
    out += ["## What was tuned, on what", "", "| | |", "|---|---|"]
    out += [f"| {e(k)} | {e(v)} |" for k, v in doc.context_rows()]
    out.append("")
    for title, pngs in doc.plot_groups():
        if pngs:
            out += [f"## {title}", ""]
            out += [f"![{e(p.stem)}]({p.relative_to(doc.out_dir).as_posix()})" for p in pngs]
            out.append("")
    if doc.notes:
        out += ["Plots left out:", ""] + [f"- {e(n)}" for n in doc.notes] + [""]
    out += _decisions(doc) + _predictions(doc)
    out += ["## Trials", "", "Values are medians where a config was measured more than once;"
            " \u2605 marks a recommended config.", "", *_md_table(*doc.trial_rows()), ""]
    if not doc.failed.empty:
        out += ["## Failures", ""]
        for _, t in doc.failed.iterrows():
            out += [f"- **Trial {t['trial']}** ({e(t['label'])}), "
                    f"{e(t['failure_kind'] or 'failed')}: {e(t['reason'])}", ""]
            if t["log_tail"]:
                out += [_fence(str(t["log_tail"]), indent="  "), ""]
    return "\n".join(out)


def _rec(doc: ReportContent, rec: Recommendation) -> list[str]:
    e = _md
    head = HEADLINES[rec.status] + (f": {rec.label}" if rec.status == "recommend" else "")
    out = [f"### Concurrency {rec.concurrency} \u2014 {e(head)}", "", e(verdicts.reason(rec)), ""]
    out += [f"**{e(m.text())}**\n" for m in doc.misses(rec)]
    if rec.serve_command:
        out += [_fence(rec.serve_command), ""]
    if rec.serve_note:
        out += [f"Note: {e(rec.serve_note)}.", ""]
    if rec.concurrency in doc.config_files:
        out += [f"Or `vllm serve --config {doc.config_files[rec.concurrency].name}`.", ""]
    split = split_table.rec_rows(rec.decomposition)
    if split:
        out += [f"| {e(rec.decomposition.label)} | |", "|---|---:|"]
        out += [f"| {e(k)} | {e(v)} |" for k, v in split]
        out.append("")
    if rec.metrics or rec.baseline_metrics:
        out += ["| metric | this config | baseline |", "|---|---:|---:|"]
        for key, name, fmt in METRIC_ROWS:
            out.append(f"| {name} | {num(rec.metrics.get(key), fmt)} | "
                       f"{num(rec.baseline_metrics.get(key), fmt)} |")
        out.append("")
    if sure := verdicts.confidence(rec):
        out += [f"Confidence: {e(sure)}", ""]
    if rec.verify_command:
        out += ["Verify:", "", _fence(rec.verify_command), ""]
    return out


def _decisions(doc: ReportContent) -> list[str]:
    if not doc.decisions:
        return []
    e = _md
    out = ["## How it was decided", "", e(decisions.INTRO), ""]
    for title, texts in doc.decisions:
        if len(texts) == 1:
            out += [f"- **{e(title)}:** {e(texts[0])}"]
        else:
            out += [f"- **{e(title)}:**"] + [f"  - {e(t)}" for t in texts]
    return [*out, ""]


def _predictions(doc: ReportContent) -> list[str]:
    intro, tables = prediction_tables(doc.predictions)
    if not intro:
        return []
    out = ["## Predicted by replay", ""]
    for text in intro:
        out += [_md(text), ""]
    for title, head, rows in tables:
        out += [f"### {_md(title)}", "", *_md_table(head, rows), ""]
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


def _md_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """A Markdown table, every cell escaped (_md)."""
    return ["| " + " | ".join(_md(h) for h in head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(_md(c) for c in r) + " |" for r in rows)]


def _md(text: Any) -> str:
    """Markdown text cell: HTML-escaped (renderers pass raw HTML through) and pipe-safe."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _fence(text: str, *, indent: str = "") -> str:
    ticks = "```"
    while ticks in text:
        ticks += "`"
    return "\n".join(indent + line for line in [ticks, *text.splitlines(), ticks])

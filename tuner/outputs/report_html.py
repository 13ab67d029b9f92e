"""Outputs stage, report.html: the report's content (tuner.outputs.report_content) as one
self-contained page (plots embedded, its own style sheet), the load-aware policy's section
included.
"""

from __future__ import annotations

import base64
import html
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuner.outputs import decisions, split_table, verdicts
from tuner.outputs.console import HEADLINES, break_even_text, open_loop_lines, policy_rows
from tuner.outputs.predictions import prediction_tables
from tuner.outputs.report_content import METRIC_ROWS, ReportContent
from tuner.outputs.text import num
from tuner.records.policy import PolicyDocument

if TYPE_CHECKING:
    from tuner.records.recommendations import Recommendation


def render(doc: ReportContent) -> str:
    """report.html's text: one page, its plots embedded."""
    e = html.escape
    body = [f"<h1>{e(doc.title())}</h1>", f"<p class='sub'>{e(doc.subtitle())}</p>"]
    if doc.incomplete_note():
        body.append(f"<p class='warn'><b>Incomplete.</b> {e(doc.incomplete_note())}</p>")
    body.append("<h2>Recommendation</h2>")
    for rec in doc.recs:
        body.append(_rec(doc, rec))
    if doc.split_table:
        body.append("<h2>Engine path and speculation</h2>"
                    f"<p class='sub'>{e(split_table.INTRO)}</p>"
                    + _html_table(*doc.split_table))
    body.append(policy_html(doc.policy))
    body.append("<h2>What was tuned, on what</h2><table class='kv'>")
    body += [f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in doc.context_rows()]
    body.append("</table>")
    for title, pngs in doc.plot_groups():
        if pngs:
            body.append(f"<h2>{e(title)}</h2>")
            body += [f"<img alt='{e(p.stem)}' src='data:image/png;base64,"
                     f"{base64.b64encode(p.read_bytes()).decode()}'>" for p in pngs]
    if doc.notes:
        body.append("<p class='sub'>Plots left out: " + "; ".join(map(e, doc.notes))
                    + "</p>")
    if doc.decisions:
        body.append("<h2>How it was decided</h2>"
                    f"<p class='sub'>{e(decisions.INTRO)}</p><table class='kv decided'>"
                    + "".join(f"<tr><th>{e(title)}</th><td>" + "".join(
                        f"<p>{e(t)}</p>" for t in texts) + "</td></tr>"
                        for title, texts in doc.decisions) + "</table>")
    intro, tables = prediction_tables(doc.predictions)
    if intro:
        body.append("<h2>Predicted by replay</h2>" + "".join(f"<p>{e(t)}</p>" for t in intro))
        body += [f"<h3>{e(title)}</h3>" + _html_table(head, rows)
                 for title, head, rows in tables]
    body += _trials(doc)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{e(doc.title())}</title><style>{_CSS}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def _trials(doc: ReportContent) -> list[str]:
    """The trials table, a row per trial coloured by state, then each failure's log."""
    e = html.escape
    head, rows = doc.trial_rows()
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
    if not doc.failed.empty:
        body.append("<h2>Failures</h2>")
        for _, t in doc.failed.iterrows():
            body.append(
                f"<details><summary>Trial {t['trial']} ({e(str(t['label']))}): "
                f"<b>{e(str(t['failure_kind'] or 'failed'))}</b> \u2014 "
                f"{e(str(t['reason']))}</summary><pre>{e(str(t['log_tail'] or '(no log)'))}"
                f"</pre></details>")
    return body


def _rec(doc: ReportContent, rec: Recommendation) -> str:
    e = html.escape
    head = HEADLINES[rec.status] + (f": {rec.label}" if rec.status == "recommend" else "")
    parts = [f"<div class='rec {rec.status}'><h3>Concurrency {rec.concurrency} \u2014 "
             f"{e(head)}</h3><p>{e(verdicts.reason(rec))}</p>"]
    parts += [f"<p class='miss'><strong>{e(m.text())}</strong></p>"
              for m in doc.misses(rec)]
    if rec.serve_command:
        parts.append(f"<pre class='cmd'>{e(rec.serve_command)}</pre>")
    if rec.serve_note:
        parts.append(f"<p>Note: {e(rec.serve_note)}.</p>")
    if rec.concurrency in doc.config_files:
        parts.append(f"<p>Or <code>vllm serve --config "
                     f"{e(doc.config_files[rec.concurrency].name)}</code>.</p>")
    split = split_table.rec_rows(rec.decomposition)
    if split:
        parts.append(f"<table class='split'><tr><th colspan='2'>"
                     f"{e(rec.decomposition.label)}</th></tr>" + "".join(
                         f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in split)
                     + "</table>")
    if rec.metrics or rec.baseline_metrics:
        parts.append("<table><tr><th>metric</th><th>this config</th><th>baseline</th></tr>")
        for key, name, fmt in METRIC_ROWS:
            parts.append(f"<tr><td>{e(name)}</td><td>{num(rec.metrics.get(key), fmt)}</td>"
                         f"<td>{num(rec.baseline_metrics.get(key), fmt)}</td></tr>")
        parts.append("</table>")
    if sure := verdicts.confidence(rec):
        parts.append(f"<p><b>Confidence:</b> {e(sure)}</p>")
    if rec.verify_command:
        parts.append(f"<p>Verify:</p><pre class='cmd'>{e(rec.verify_command)}</pre>")
    return "".join(parts) + "</div>"


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


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A wide table that scrolls, its first column a config (which wraps; figures do not)."""
    e = html.escape
    return ("<div class='scroll'><table class='trials'><tr>"
            + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
            + "".join("<tr><td class='cfg'>" + e(r[0]) + "</td>"
                      + "".join(f"<td>{e(c)}</td>" for c in r[1:]) + "</tr>" for r in rows)
            + "</table></div>")


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

"""Outputs stage, the content of a report: the study's counts, title, context, trial rows,
plot groups and recommendation.json's summary (the policy's part included), which
tuner.outputs.report_markdown and report_html render and tuner.outputs.report writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.outputs import verdicts
from tuner.outputs.text import num, times
from tuner.records.configs import RequestSchedule
from tuner.records.policy import PolicyDocument
from tuner.records.predictions import PredictionMiss
from tuner.records.results import LevelMetrics
from tuner.records.storage import StudySettings

if TYPE_CHECKING:
    import pandas as pd

    from tuner.records.recommendations import Recommendation


# Each recommendation's metric table, a row per (key, name, format), in both renderings.
METRIC_ROWS = (("output_throughput", "output throughput (tok/s)", "{:.1f}"),
               ("mean_tpot_ms", "mean TPOT (ms)", "{:.1f}"),
               ("p99_tpot_ms", "p99 TPOT (ms)", "{:.1f}"),
               ("mean_ttft_ms", "mean TTFT (ms)", "{:.0f}"),
               ("p99_ttft_ms", "p99 TTFT (ms)", "{:.0f}"),
               ("spec_decode_acceptance_rate", "acceptance rate (%)", "{:.0f}%"),
               ("spec_decode_acceptance_length", "mean acceptance length (tokens/step)",
                "{:.2f}"))


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


class ReportContent:
    """The content of one report: the JSON summary (recommendation.json), and what the
    Markdown and HTML renderings (report_markdown, report_html) both say."""

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

    def misses(self, rec: Recommendation) -> list[PredictionMiss]:
        """Every launched config at the recommendation's level whose acceptance the replay
        missed beyond its stated accuracy, the chosen one's already in its reason."""
        said = {m.key for m in rec.prediction_misses}
        return [m for m in self.settings.misses_at(rec.concurrency) if m.key not in said]


def _steadiness(row: pd.Series) -> str:
    """' (±1.2%)' or ' (not converged ±6.1%)' after a level measured in windows, else ''."""
    converged, pct = row.get("converged"), row.get("stability_pct")
    text = LevelMetrics.stability_text(None if _isna(converged) else bool(converged),
                                       None if _isna(pct) else float(pct))
    return f" ({text})" if text else ""


def _isna(value: Any) -> bool:
    import pandas as pd

    return bool(pd.isna(value)) if not isinstance(value, (list, tuple)) else False


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

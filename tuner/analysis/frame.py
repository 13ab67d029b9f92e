"""Analysis stage, the frame: the study's trials as a table, read only through the storage
contract (trial attrs "config", "result", "role", "failure", "duplicate_of", ...).

Promises: one row per (trial, concurrency level), failed and unfinished trials kept as rows
with their reason; and a frame with one row per (config, level) whose repeats are pooled
(median and spread). Pure functions of what the study stores: no engine, no Optuna writes.
"""

from __future__ import annotations

import json
import math
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tuner.records import LevelMetrics, Role, TrialAttr, TrialConfig

if TYPE_CHECKING:
    import optuna

# The level's figures as columns; the percentiles a user selected (LevelMetrics.percentiles,
# "p95_tpot_ms", ...) become columns of their own after these.
LEVEL_FIELDS = tuple(f for f in LevelMetrics.model_fields if f != "percentiles")
_PERCENTILE_COLUMN = re.compile(r"^p\d+(\.\d+)?_[a-z]+_ms$")
# Metrics whose run-to-run spread is measured; they are the two objectives of a study.
SPREAD_METRICS = ("output_throughput", "mean_tpot_ms")
# A recommendation needs a choice: at least this many distinct speculative configs measured.
MIN_CANDIDATES = 2
TRIAL_COLUMNS = (
    "study", "trial", "state", "role", "method", "label", "spec_json", "engine_args_json",
    "config_key", "num_speculative_tokens", "duplicate_of", "reason", "failure_kind", "log_tail",
    "engine_start_s", "vllm_version",
)
SPREAD_COLUMNS = (
    "n_measurements", "n_repeats",
    *(f"{m}_{s}" for m in SPREAD_METRICS for s in ("median", "mad")),
)
SPEEDUP_COLUMNS = ("speedup_throughput", "speedup_tpot")
# decompose(): the speedup over the plain baseline = the engine path's cost (aligned baseline
# over plain) x what speculation alone gives (this config over the aligned baseline); each
# with its spread, in the ratio's own units.
DECOMPOSITION_COLUMNS = ("total_speedup", "total_speedup_spread", "path_cost",
                         "path_cost_spread", "speculation_gain", "speculation_gain_spread")
CONFIG_COLUMNS = ("trials", "n_failed")  # configs_frame: a config's launches, failed ones
_NOT_FINISHED = {
    "RUNNING": "not finished: still running, or the driver was stopped (rerun the same "
               "command to resume)",
    "WAITING": "queued, not started yet",
    "PRUNED": "pruned by the sampler before it was measured",
}


# --- the frame ----------------------------------------------------------------------------


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per (trial, concurrency level); failed and unfinished trials get one row.

    Columns: TRIAL_COLUMNS, the flat Optuna params as `params_<name>`, `concurrency`, every
    LevelMetrics field, and SPREAD_COLUMNS: median and MAD of throughput and TPOT over every
    measurement of the same config (the trial's own result, its "repeats", and other trials of
    the same config that are not copies); NaN when the config was measured once. The study's
    "tuner" attributes are kept in `df.attrs["tuner"]` for commands and titles.
    """
    rows: list[dict[str, Any]] = []
    pooled: dict[tuple[str, int], list[tuple[float, float]]] = {}
    param_names: dict[str, None] = {}
    percentile_names: dict[str, None] = {}
    for t in study.get_trials(deepcopy=False):
        base = _trial_base(t, study.study_name)
        for name, value in t.params.items():
            param_names[f"params_{name}"] = None
            base[f"params_{name}"] = value
        result = t.user_attrs.get(TrialAttr.RESULT) if t.state.name == "COMPLETE" else None
        levels = [LevelMetrics.migrate(lv) for lv in (result or {}).get("levels", [])
                  if isinstance(lv, dict)]
        if not levels:
            if t.state.name == "COMPLETE":
                base["reason"] = "completed without a stored result (nothing to analyse)"
            rows.append(base)
            continue
        for lv in levels:
            chosen = {k: v for k, v in (lv.get("percentiles") or {}).items()
                      if k not in LevelMetrics.model_fields}
            percentile_names.update(dict.fromkeys(chosen))
            rows.append({**base, **{f: lv.get(f) for f in LEVEL_FIELDS}, **chosen})
        if base["duplicate_of"] is None:  # a copy would count the same measurement twice
            runs = [levels] + [r for r in t.user_attrs.get(TrialAttr.REPEATS) or [] if isinstance(r, list)]
            for run in runs:
                for lv in run:
                    if isinstance(lv, dict) and lv.get("concurrency") is not None:
                        pooled.setdefault((base["config_key"], int(lv["concurrency"])), []).append(
                            (number(lv.get("output_throughput")), number(lv.get("mean_tpot_ms"))))
    columns = [*TRIAL_COLUMNS, *param_names, *LEVEL_FIELDS, *percentile_names, *SPREAD_COLUMNS]
    df = pd.DataFrame(rows, columns=columns)
    df["trial"] = df["trial"].astype("Int64")
    df["concurrency"] = pd.to_numeric(df["concurrency"]).astype("Int64")
    df["duplicate_of"] = pd.to_numeric(df["duplicate_of"]).astype("Int64")
    for i, row in df.iterrows():
        if pd.isna(row["concurrency"]):
            continue
        runs = pooled.get((row["config_key"], int(row["concurrency"])))
        if runs is None:  # a duplicate whose original is gone: its own value, once
            runs = [(number(row["output_throughput"]), number(row["mean_tpot_ms"]))]
        df.at[i, "n_measurements"] = len(runs)
        df.at[i, "n_repeats"] = len(runs) - 1
        for j, metric in enumerate(SPREAD_METRICS):
            values = np.array([r[j] for r in runs], dtype=float)
            values = values[~np.isnan(values)]
            if len(values) > 1:
                median = float(np.median(values))
                df.at[i, f"{metric}_median"] = median
                df.at[i, f"{metric}_mad"] = float(np.median(np.abs(values - median)))
    for col in SPREAD_COLUMNS:
        df[col] = pd.to_numeric(df[col])
    df["n_measurements"] = df["n_measurements"].astype("Int64")
    df["n_repeats"] = df["n_repeats"].astype("Int64")
    df.attrs["tuner"] = dict(study.user_attrs.get("tuner") or {})
    df.attrs["study_name"] = study.study_name
    return df


def _trial_base(t: Any, study_name: str) -> dict[str, Any]:
    attrs = t.user_attrs
    # A trial not asked yet (WAITING) has only what was enqueued: an override or fixed params.
    fixed = (getattr(t, "system_attrs", None) or {}).get("fixed_params") or {}
    config = _trial_config(attrs.get(TrialAttr.CONFIG) or attrs.get(TrialAttr.CONFIG_OVERRIDE),
                           {**fixed, **t.params})
    failure = attrs.get(TrialAttr.FAILURE) or {}
    result = attrs.get(TrialAttr.RESULT) or {}
    engine = result.get("engine") or {} if isinstance(result, dict) else {}
    state = t.state.name
    reason = None
    if state == "FAIL":
        reason = str(failure.get("reason") or "failed without a recorded reason")
    elif state in _NOT_FINISHED:
        reason = _NOT_FINISHED[state]
    spec = config.speculative_config or {}
    return {
        "study": study_name, "trial": t.number, "state": state,
        "role": attrs.get(TrialAttr.ROLE, Role.SEARCH.value), "method": config.method,
        "label": str(attrs.get(TrialAttr.LABEL) or config.label()),
        "spec_json": config.spec_json(),
        "engine_args_json": json.dumps(config.engine_args, sort_keys=True),
        "config_key": config.key(),
        "num_speculative_tokens": spec.get("num_speculative_tokens"),
        "duplicate_of": attrs.get(TrialAttr.DUPLICATE_OF),
        "reason": reason,
        "failure_kind": failure.get("kind") if state == "FAIL" else None,
        "log_tail": failure.get("log_tail") if state == "FAIL" else None,
        "engine_start_s": engine.get("start_s"), "vllm_version": engine.get("vllm_version"),
    }


def _trial_config(stored: Any, params: dict[str, Any]) -> TrialConfig:
    """The trial's config as stored; rebuilt from the flat params when the attr is missing."""
    if isinstance(stored, dict):
        try:
            return TrialConfig.model_validate(stored)
        except ValueError:
            pass
    method = params.get("method", "none")
    if method == "none":
        return TrialConfig()
    spec = {"method": method}
    spec.update({k.split(".", 1)[1]: v for k, v in params.items() if k.startswith(f"{method}.")})
    engine = {k.split(".", 1)[1]: v for k, v in params.items() if k.startswith("engine.")}
    return TrialConfig(speculative_config=spec, engine_args=engine)


def number(value: Any) -> float:
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def with_medians(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with throughput and TPOT replaced by their median where a config was re-measured.

    Every comparison (fronts, speedups, recommendations, plots) uses these robust values, so
    trials of the same config collapse onto one point.
    """
    out = df.copy()
    for metric in SPREAD_METRICS:
        median = out[f"{metric}_median"]
        out[metric] = median.where(median.notna(), out[metric])
    return out


def configs_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (config, concurrency level): trials_frame with each config listed once.

    The trials of one config (first launch, repeats, a relaunch after a transient failure) are
    pooled: throughput and TPOT are the medians of SPREAD_COLUMNS (MAD and n_measurements
    beside them), every other numeric level field the median over those trials, list fields
    the first trial's. Proposals answered from storage (`duplicate_of`) are left out: they
    measured nothing. A config never measured keeps one row, its latest trial (the failure
    reason, or the unfinished state). `trial` is the config's first measured trial, `trials`
    (JSON list) all its launches, `n_failed` those that failed; `duplicate_of` is dropped.
    """
    launched = df[df["duplicate_of"].isna()]
    numeric = [f for f in df.columns if (f in LEVEL_FIELDS or _PERCENTILE_COLUMN.match(f))
               and pd.api.types.is_numeric_dtype(df[f])]
    rows: list[dict[str, Any]] = []
    for _, group in launched.groupby("config_key", sort=False, dropna=False):
        group = group.sort_values(["trial", "concurrency"], kind="stable")
        extra = {"trials": json.dumps(sorted({int(t) for t in group["trial"].dropna()})),
                 "n_failed": int(group.loc[group["state"] == "FAIL", "trial"].nunique())}
        done = group[(group["state"] == "COMPLETE") & group["concurrency"].notna()]
        if done.empty:
            rows.append({**group.iloc[-1].to_dict(), **extra})
            continue
        for _, level in done.groupby("concurrency", sort=True):
            row = {**level.iloc[0].to_dict(), **extra}
            if len(level) > 1:
                row.update({f: level[f].median() for f in numeric})
            for metric in SPREAD_METRICS:
                if pd.notna(row.get(f"{metric}_median")):
                    row[metric] = row[f"{metric}_median"]
            rows.append(row)
    columns = [c for c in df.columns if c != "duplicate_of"] + list(CONFIG_COLUMNS)
    out = pd.DataFrame(rows, columns=columns)
    if not out.empty:
        out = out.sort_values(["trial", "concurrency"], kind="stable").reset_index(drop=True)
    for col in ("trial", "concurrency", "n_measurements", "n_repeats", "n_failed"):
        out[col] = pd.to_numeric(out[col]).astype("Int64")
    out.attrs = dict(df.attrs)
    return out


def levels_of(df: pd.DataFrame, meta: dict[str, Any] | None = None) -> list[int]:
    """The study's concurrency levels: those it was asked for, and any that were measured."""
    asked = ((meta or {}).get("settings") or {}).get("concurrencies") or []
    measured = df["concurrency"].dropna().astype(int).tolist()
    return sorted({int(c) for c in [*asked, *measured]})


def is_baseline(df: pd.DataFrame) -> pd.Series:
    return (df["state"] == "COMPLETE") & (df["method"] == "none") & (df["role"] == Role.BASELINE)


def is_aligned_baseline(df: pd.DataFrame) -> pd.Series:
    """The aligned baseline: no speculation on the speculative engine path (tuner.search)."""
    return ((df["state"] == "COMPLETE") & (df["method"] == "none")
            & (df["role"] == Role.ALIGNED_BASELINE))


def relative_spread(row: Any) -> float:
    """A row's run-to-run throughput spread as a fraction (MAD / median over its repeats);
    NaN when its config was measured once."""
    median, mad = number(row.get("output_throughput_median")), number(
        row.get("output_throughput_mad"))
    return mad / median if median > 0 and not math.isnan(mad) else math.nan


def ratio_spread(ratio: float, *rows: Any) -> float:
    """The spread of a ratio of two rows' throughputs, in the ratio's units: the ratio times
    the larger relative spread of the two (the rule recommend applies to a speedup); NaN
    when neither row was re-measured."""
    rels = [r for r in (relative_spread(row) for row in rows) if not math.isnan(r)]
    return ratio * max(rels) if rels and not math.isnan(ratio) else math.nan


def ratio_text(value: Any, spread: Any = None) -> str:
    """A ratio as every table and sentence shows it: "1.07x \u00b10.02" (the spread in the
    ratio's units, as ratio_spread gives it), the spread left out where it was not measured;
    "-" without a value."""
    v, sp = number(value), number(spread)
    if math.isnan(v):
        return "-"
    return f"{v:.2f}x" + ("" if math.isnan(sp) else f" \u00b1{sp:.2f}")


def split_text(path: Any, path_spread: Any, gain: Any, gain_spread: Any) -> str:
    """The decomposition's product in the one wording the recommendation, the policy and the
    plots share: "path 0.83x \u00b10.02 x speculation 1.28x \u00b10.04" (ratio_text)."""
    return f"path {ratio_text(path, path_spread)} x speculation {ratio_text(gain, gain_spread)}"


def decompose(df: pd.DataFrame) -> pd.DataFrame:
    """A copy of `df` with DECOMPOSITION_COLUMNS where the study measured an aligned baseline
    at the row's level (NaN elsewhere, and for rows that did not complete).

    total_speedup = path_cost x speculation_gain, exactly: throughput over the plain baseline's
    (what a user gets today), the aligned baseline's over the plain one's (what the engine path
    the speculative configs run on costs without any speculation), and throughput over the
    aligned baseline's (what speculation alone gives). Medians where a config was re-measured,
    the earliest of each baseline, spreads as ratio_spread; per study when `df` has several.
    """
    out = df.copy()
    for col in DECOMPOSITION_COLUMNS:
        out[col] = math.nan
    if df.empty:
        return out
    robust = with_medians(df)
    plain_rows = robust[is_baseline(robust)].sort_values("trial", kind="stable")
    aligned_rows = robust[is_aligned_baseline(robust)].sort_values("trial", kind="stable")
    if aligned_rows.empty or plain_rows.empty:
        return out
    keys = ["study", "concurrency"] if "study" in robust else ["concurrency"]
    # Reversed, so the earliest trial of each baseline is the one kept per level.
    plain = {tuple(r[k] for k in keys): r for _, r in plain_rows.iloc[::-1].iterrows()}
    aligned = {tuple(r[k] for k in keys): r for _, r in aligned_rows.iloc[::-1].iterrows()}
    for i, row in robust.iterrows():
        at = tuple(row[k] for k in keys)
        if row["state"] != "COMPLETE" or at not in plain or at not in aligned:
            continue
        p, a = plain[at], aligned[at]
        thr, p_thr, a_thr = (number(x["output_throughput"]) for x in (row, p, a))
        if not (p_thr > 0 and a_thr > 0) or math.isnan(thr):
            continue
        total, path, gain = thr / p_thr, a_thr / p_thr, thr / a_thr
        out.loc[i, list(DECOMPOSITION_COLUMNS)] = [
            total, ratio_spread(total, row, p), path, ratio_spread(path, a, p),
            gain, ratio_spread(gain, row, a)]
    for col in DECOMPOSITION_COLUMNS:
        out[col] = pd.to_numeric(out[col])
    return out

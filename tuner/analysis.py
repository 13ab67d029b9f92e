"""Analysis stage: from the Optuna storage to decisions a person can act on.

Reads trials only through the storage contract (user_attrs "config", "result", "repeats",
"failure", ...) and promises: a flat frame with one row per (trial, concurrency level), failed
and unfinished trials kept as rows with their reason, and one with a row per (config, level)
whose repeats are pooled; Pareto fronts of throughput against per-token latency; speedups
against the no-speculation baseline of the same study at the same concurrency; and a
Recommendation per level that states how sure it is and refuses, with the
reason, when the data cannot support one. Never touches an engine.
"""

from __future__ import annotations

import json
import math
import shlex
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pandas as pd

from tuner.records import EngineSpec, Frozen, LevelMetrics, TrialConfig
from tuner.engine import engine_flags

if TYPE_CHECKING:
    import optuna

LEVEL_FIELDS = tuple(LevelMetrics.model_fields)
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
CONFIG_COLUMNS = ("trials", "n_failed")  # configs_frame: a config's launches, failed ones
_NOT_FINISHED = {
    "RUNNING": "not finished: still running, or the driver was stopped (rerun the same "
               "command to resume)",
    "WAITING": "queued, not started yet",
    "PRUNED": "pruned by the sampler before it was measured",
}

Status = Literal["recommend", "speculation_off", "insufficient_data"]


class Recommendation(Frozen):
    """What to run at one concurrency level, or why the data cannot say."""

    concurrency: int
    status: Status
    reason: str
    speculative_config: dict[str, Any] | None = None
    label: str | None = None
    trial: int | None = None
    serve_command: str | None = None
    metrics: dict[str, float | None] = {}
    baseline_metrics: dict[str, float | None] = {}
    speedup_throughput: float | None = None  # > 1: more output tokens per second
    speedup_tpot: float | None = None  # baseline TPOT / this TPOT; > 1: faster per token
    spread: dict[str, float | None] = {}
    n_repeats: int = 0  # re-measurements of the chosen config beyond the first
    confidence: str = ""
    verify_command: str | None = None
    slos: dict[str, float | None] = {}


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
    for t in study.get_trials(deepcopy=False):
        base = _trial_base(t, study.study_name)
        for name, value in t.params.items():
            param_names[f"params_{name}"] = None
            base[f"params_{name}"] = value
        result = t.user_attrs.get("result") if t.state.name == "COMPLETE" else None
        levels = [lv for lv in (result or {}).get("levels", []) if isinstance(lv, dict)]
        if not levels:
            if t.state.name == "COMPLETE":
                base["reason"] = "completed without a stored result (nothing to analyse)"
            rows.append(base)
            continue
        for lv in levels:
            rows.append({**base, **{f: lv.get(f) for f in LEVEL_FIELDS}})
        if base["duplicate_of"] is None:  # a copy would count the same measurement twice
            runs = [levels] + [r for r in t.user_attrs.get("repeats") or [] if isinstance(r, list)]
            for run in runs:
                for lv in run:
                    if isinstance(lv, dict) and lv.get("concurrency") is not None:
                        pooled.setdefault((base["config_key"], int(lv["concurrency"])), []).append(
                            (_num(lv.get("output_throughput")), _num(lv.get("mean_tpot_ms"))))
    columns = [*TRIAL_COLUMNS, *param_names, *LEVEL_FIELDS, *SPREAD_COLUMNS]
    df = pd.DataFrame(rows, columns=columns)
    df["trial"] = df["trial"].astype("Int64")
    df["concurrency"] = pd.to_numeric(df["concurrency"]).astype("Int64")
    df["duplicate_of"] = pd.to_numeric(df["duplicate_of"]).astype("Int64")
    for i, row in df.iterrows():
        if pd.isna(row["concurrency"]):
            continue
        runs = pooled.get((row["config_key"], int(row["concurrency"])))
        if runs is None:  # a duplicate whose original is gone: its own value, once
            runs = [(_num(row["output_throughput"]), _num(row["mean_tpot_ms"]))]
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
    config = _trial_config(attrs.get("config") or attrs.get("config_override"),
                           {**fixed, **t.params})
    failure = attrs.get("failure") or {}
    result = attrs.get("result") or {}
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
        "role": attrs.get("role", "search"), "method": config.method,
        "label": str(attrs.get("label") or config.label()),
        "spec_json": config.spec_json(),
        "engine_args_json": json.dumps(config.engine_args, sort_keys=True),
        "config_key": config.key(),
        "num_speculative_tokens": spec.get("num_speculative_tokens"),
        "duplicate_of": attrs.get("duplicate_of"),
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


def _num(value: Any) -> float:
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
    numeric = [f for f in LEVEL_FIELDS if f in df and pd.api.types.is_numeric_dtype(df[f])]
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


# --- fronts and speedups ------------------------------------------------------------------


def pareto_front(
    df_level: pd.DataFrame, *, x: str = "mean_tpot_ms", y: str = "output_throughput",
) -> pd.DataFrame:
    """The rows no other row beats: lower or equal `x` and higher or equal `y`, one strictly.

    Identical points do not dominate each other, so both stay on the front. Rows that are not
    COMPLETE or lack either value are ignored. Sorted by `x` ascending (then `y` descending).
    """
    if "concurrency" in df_level and df_level["concurrency"].dropna().nunique() > 1:
        raise ValueError("pareto_front needs rows of one concurrency level; filter first, e.g. "
                         "df[df.concurrency == 8].")
    ok = df_level
    if "state" in ok:
        ok = ok[ok["state"] == "COMPLETE"]
    xs = pd.to_numeric(ok[x], errors="coerce")
    ys = pd.to_numeric(ok[y], errors="coerce")
    keep = xs.notna() & ys.notna()
    ok, xv, yv = ok[keep], xs[keep].to_numpy(float), ys[keep].to_numpy(float)
    if ok.empty:
        return ok.copy()
    # dominated[i]: some j is at least as good on both and strictly better on one.
    no_worse = (xv[None, :] <= xv[:, None]) & (yv[None, :] >= yv[:, None])
    better = (xv[None, :] < xv[:, None]) | (yv[None, :] > yv[:, None])
    dominated = (no_worse & better).any(axis=1)
    front = ok[~dominated].copy()
    return front.sort_values([x, y], ascending=[True, False], kind="stable")


def speedups(df: pd.DataFrame) -> pd.DataFrame:
    """A copy with `speedup_throughput` (this / baseline) and `speedup_tpot` (baseline / this).

    The baseline is the completed no-speculation trial with role "baseline" of the same study
    at the same concurrency (the earliest when there are several); medians are used where a
    config was re-measured. Rows without such a baseline get NaN.
    """
    out = df.copy()
    robust = with_medians(df)
    out["speedup_throughput"] = math.nan
    out["speedup_tpot"] = math.nan
    base = robust[_is_baseline(robust)].sort_values("trial")
    if base.empty:
        return out
    keys = ["study", "concurrency"] if "study" in robust else ["concurrency"]
    base = base.drop_duplicates(keys)[[*keys, *SPREAD_METRICS]]
    merged = robust[keys].merge(base, on=keys, how="left", suffixes=("", "_base"))
    merged.index = robust.index
    complete = robust["state"] == "COMPLETE"
    out.loc[complete, "speedup_throughput"] = (
        robust["output_throughput"] / merged["output_throughput"])[complete]
    out.loc[complete, "speedup_tpot"] = (merged["mean_tpot_ms"] / robust["mean_tpot_ms"])[complete]
    out["speedup_throughput"] = pd.to_numeric(out["speedup_throughput"])
    out["speedup_tpot"] = pd.to_numeric(out["speedup_tpot"])
    return out


def _is_baseline(df: pd.DataFrame) -> pd.Series:
    return (df["state"] == "COMPLETE") & (df["method"] == "none") & (df["role"] == "baseline")


def knee(front: pd.DataFrame, *, x: str = "mean_tpot_ms", y: str = "output_throughput") -> Any:
    """Index of the front's knee: farthest from the chord joining its ends, both axes scaled
    to [0, 1]. With one or two points (no bend to find) the highest `y` wins."""
    if len(front) <= 2:
        by = [y, x, "trial"] if "trial" in front else [y, x]
        return front.sort_values(by, ascending=[False, True, True][: len(by)],
                                 kind="stable").index[0]
    xs = front[x].to_numpy(float)
    ys = front[y].to_numpy(float)
    xn = (xs - xs.min()) / ((xs.max() - xs.min()) or 1.0)
    yn = (ys - ys.min()) / ((ys.max() - ys.min()) or 1.0)
    (x0, y0), (x1, y1) = (xn[0], yn[0]), (xn[-1], yn[-1])
    dist = np.abs((x1 - x0) * (y0 - yn) - (x0 - xn) * (y1 - y0))
    if np.allclose(dist, 0.0):  # a straight front: no knee, take the most throughput
        return front.index[int(np.argmax(ys))]
    return front.index[int(np.argmax(dist))]


# --- recommendation -----------------------------------------------------------------------


def recommend(
    df: pd.DataFrame, *, concurrency: int, max_tpot_ms: float | None = None,
    max_ttft_ms: float | None = None, meta: dict[str, Any] | None = None,
) -> Recommendation:
    """The config to run at `concurrency`, "leave speculation off", or a refusal with reasons.

    With SLOs (mean TPOT, p99 TTFT: the metrics tuner/study.py constrains the sampler on) the
    winner is the highest-throughput point of the front among configs meeting them; without,
    the knee of the front. `meta` is the study's "tuner" attributes (model, workload) for the
    commands; default `df.attrs["tuner"]`.
    """
    meta = meta if meta is not None else dict(df.attrs.get("tuner") or {})
    slos = {"max_tpot_ms": max_tpot_ms, "max_ttft_ms": max_ttft_ms}
    at = df[(df["concurrency"] == concurrency).fillna(False)]
    level = speedups(with_medians(at[at["state"] == "COMPLETE"])).reset_index(drop=True)

    def refuse(status: Status, reason: str, **extra: Any) -> Recommendation:
        return Recommendation(concurrency=concurrency, status=status, reason=reason, slos=slos,
                              **extra)

    base_rows = level[_is_baseline(level)].sort_values("trial")
    if base_rows.empty:
        failed = df[(df["state"] == "FAIL") & (df["role"] == "baseline")]
        waiting = df[df["state"].isin(["RUNNING", "WAITING"]) & (df["role"] == "baseline")]
        why = (f" The baseline trial failed: {failed['reason'].iloc[0]}" if not failed.empty
               else " The baseline trial has not finished yet." if not waiting.empty else "")
        return refuse("insufficient_data",
                      f"No baseline (no speculation) was measured at concurrency {concurrency}, "
                      f"so no speedup can be stated.{why} Measure it with: "
                      f"{_verify_command(meta, TrialConfig(), concurrency)}",
                      verify_command=_verify_command(meta, TrialConfig(), concurrency))
    base = base_rows.iloc[0]
    base_metrics = _metrics(base)
    candidates = level[level["method"] != "none"]
    n_configs = candidates["config_key"].nunique()
    if n_configs < MIN_CANDIDATES:
        return refuse("insufficient_data",
                      f"Only {n_configs} speculative config(s) completed at concurrency "
                      f"{concurrency}; at least {MIN_CANDIDATES} besides the baseline are needed "
                      f"before choosing one. Run more trials (or resume the study).",
                      baseline_metrics=base_metrics)

    feasible = level
    if max_tpot_ms is not None:
        feasible = feasible[feasible["mean_tpot_ms"] <= max_tpot_ms]
    if max_ttft_ms is not None:
        feasible = feasible[feasible["p99_ttft_ms"] <= max_ttft_ms]
    front = pareto_front(feasible)
    if front.empty:
        best = level.sort_values("mean_tpot_ms").iloc[0]
        return refuse("insufficient_data",
                      f"No measured config meets {_slo_text(slos)} at concurrency "
                      f"{concurrency}; the lowest mean TPOT was {best['mean_tpot_ms']:.1f} ms "
                      f"({best['label']}, p99 TTFT {best['p99_ttft_ms']:.0f} ms). Relax the "
                      f"SLOs, or search other methods.", baseline_metrics=base_metrics)
    base_feasible = base.name in feasible.index
    if max_tpot_ms is None and max_ttft_ms is None:
        # Only points that raise throughput over the baseline are candidates for the knee.
        gaining = front[front["output_throughput"] > base["output_throughput"]]
        win_idx = knee(gaining) if not gaining.empty else base.name
        how = "the knee of the throughput/latency front"
    else:
        win_idx = front.sort_values(["output_throughput", "mean_tpot_ms", "trial"],
                                    ascending=[False, True, True]).index[0]
        how = f"the highest throughput meeting {_slo_text(slos)}"
    win = level.loc[win_idx]
    spread = _spread(win, base)
    gain = float(win["speedup_throughput"]) - 1.0
    common = dict(baseline_metrics=base_metrics, spread=spread,
                  n_repeats=int(_int(win["n_repeats"])))

    if win["method"] == "none" or (base_feasible and gain <= 0):
        best = candidates.sort_values(["output_throughput", "trial"],
                                      ascending=[False, True]).iloc[0]
        ratio = float(best["speedup_throughput"])
        among = (f" among the configs meeting {_slo_text(slos)}"
                 if any(v is not None for v in slos.values()) else "")
        return refuse(
            "speculation_off",
            f"Leave speculation off at concurrency {concurrency}: no speculative config beat "
            f"the baseline (no speculation){among}. The fastest one, {best['label']}, reached "
            f"{ratio:.2f}x the baseline's throughput ({best['output_throughput']:.1f} against "
            f"{base['output_throughput']:.1f} tok/s). Serve without --speculative-config.",
            serve_command=_serve_command(meta, TrialConfig()), metrics=base_metrics,
            baseline_metrics=base_metrics, label=str(base["label"]), trial=int(base["trial"]),
            speedup_throughput=1.0, speedup_tpot=1.0, spread=_spread(best, base),
            n_repeats=int(_int(base["n_repeats"])),
            confidence=_confidence(win=best, base=base, gain=ratio - 1.0,
                                   spread_rel=_spread(best, base)["relative_throughput_spread"]),
            verify_command=_verify_command(meta, TrialConfig(), concurrency))

    config = _row_config(win)
    spread_rel = spread["relative_throughput_spread"]
    # Without repeats the spread is unknown; a gain below the assumed noise floor is not
    # evidence (single runs on shared machines differ by a few percent).
    noise = spread_rel if spread_rel is not None else UNMEASURED_NOISE
    noise_text = (f"within the measured run-to-run spread (±{spread_rel:.1%})"
                  if spread_rel is not None else
                  f"below the ±{UNMEASURED_NOISE:.0%} that single runs can differ by (spread "
                  f"not measured; use --repeats 3)")
    if base_feasible and gain <= noise:
        return refuse(
            "insufficient_data",
            f"The best config at concurrency {concurrency}, {win['label']}, gains "
            f"{gain:+.1%} throughput over the baseline, {noise_text}: the data cannot tell it "
            f"from noise, so speculation stays off until it is re-measured. Re-measure with "
            f"the verify command.",
            label=str(win["label"]), trial=int(win["trial"]), metrics=_metrics(win),
            speedup_throughput=float(win["speedup_throughput"]),
            speedup_tpot=float(win["speedup_tpot"]),
            verify_command=_verify_command(meta, config, concurrency), **common,
            confidence=_confidence(win=win, base=base, gain=gain, spread_rel=spread_rel))

    reason = (f"{win['label']} is {how} at concurrency {concurrency}: "
              f"{win['output_throughput']:.1f} tok/s ({float(win['speedup_throughput']):.2f}x "
              f"the baseline's {base['output_throughput']:.1f}), mean TPOT "
              f"{win['mean_tpot_ms']:.1f} ms (baseline {base['mean_tpot_ms']:.1f} ms).")
    if not base_feasible:
        reason += f" The baseline itself misses {_slo_text(slos)}."
    if float(win["speedup_tpot"]) < 1.0:
        reason += " It pays for the throughput with a higher per-token latency."
    return Recommendation(
        concurrency=concurrency, status="recommend", reason=reason,
        speculative_config=config.speculative_config, label=str(win["label"]),
        trial=int(win["trial"]), serve_command=_serve_command(meta, config),
        metrics=_metrics(win), speedup_throughput=float(win["speedup_throughput"]),
        speedup_tpot=float(win["speedup_tpot"]), slos=slos,
        confidence=_confidence(win=win, base=base, gain=gain, spread_rel=spread_rel),
        verify_command=_verify_command(meta, config, concurrency), **common)


def recommendations(study: optuna.Study, df: pd.DataFrame | None = None) -> list[Recommendation]:
    """One Recommendation per measured concurrency level, with the study's stored SLOs."""
    df = trials_frame(study) if df is None else df
    meta = dict(study.user_attrs.get("tuner") or {})
    slos = meta.get("constraints") or {}
    return [recommend(df, concurrency=c, max_tpot_ms=slos.get("max_tpot_ms"),
                      max_ttft_ms=slos.get("max_ttft_ms"), meta=meta)
            for c in levels_of(df, meta)]


def levels_of(df: pd.DataFrame, meta: dict[str, Any] | None = None) -> list[int]:
    """The study's concurrency levels: those it was asked for, and any that were measured."""
    asked = ((meta or {}).get("settings") or {}).get("concurrencies") or []
    measured = df["concurrency"].dropna().astype(int).tolist()
    return sorted({int(c) for c in [*asked, *measured]})


def _row_config(row: pd.Series) -> TrialConfig:
    return TrialConfig(speculative_config=json.loads(row["spec_json"]),
                       engine_args=json.loads(row["engine_args_json"]))


def _metrics(row: pd.Series) -> dict[str, float | None]:
    names = {"output_throughput": "output_throughput", "mean_tpot_ms": "mean_tpot_ms",
             "p99_tpot_ms": "p99_tpot_ms", "mean_ttft_ms": "mean_ttft_ms",
             "p99_ttft_ms": "p99_ttft_ms", "acceptance_rate": "spec_decode_acceptance_rate",
             "acceptance_length": "spec_decode_acceptance_length"}
    return {k: _opt(row.get(col)) for k, col in names.items()}


UNMEASURED_NOISE = 0.05


def _spread(win: pd.Series, base: pd.Series) -> dict[str, float | None]:
    def rel(row: pd.Series) -> float | None:
        med, mad = _opt(row["output_throughput_median"]), _opt(row["output_throughput_mad"])
        return None if med is None or mad is None or med <= 0 else mad / med

    rels = [r for r in (rel(win), rel(base)) if r is not None]
    return {
        "output_throughput_median": _opt(win["output_throughput_median"]),
        "output_throughput_mad": _opt(win["output_throughput_mad"]),
        "mean_tpot_ms_median": _opt(win["mean_tpot_ms_median"]),
        "mean_tpot_ms_mad": _opt(win["mean_tpot_ms_mad"]),
        "baseline_output_throughput_mad": _opt(base["output_throughput_mad"]),
        # The larger relative MAD of the two: a gain below it cannot be told from noise.
        "relative_throughput_spread": max(rels) if rels else None,
    }


def _confidence(*, win: pd.Series, base: pd.Series, gain: float,
                spread_rel: float | None) -> str:
    n_win, n_base = int(_int(win["n_measurements"])), int(_int(base["n_measurements"]))
    runs = (f"{n_win} measurement(s) of {win['label']}, {n_base} of the baseline")
    if spread_rel is None:
        if abs(gain) >= 0.25:
            return (f"medium: {runs}; spread not measured, but a {gain:+.0%} difference is far "
                    f"beyond typical run-to-run noise (a few percent).")
        return (f"low: {runs}; spread not measured, and a {gain:+.1%} difference can be "
                f"run-to-run noise. Re-measure before relying on it.")
    margin = abs(gain) / spread_rel if spread_rel > 0 else math.inf
    level = "high" if min(n_win, n_base) >= 3 and margin >= 2 else (
        "medium" if margin > 1 else "low")
    return (f"{level}: {runs}; throughput difference {gain:+.1%} against a spread (MAD) of "
            f"±{spread_rel:.1%}.")


def _slo_text(slos: dict[str, float | None]) -> str:
    parts = []
    if slos.get("max_tpot_ms") is not None:
        parts.append(f"mean TPOT <= {slos['max_tpot_ms']:g} ms")
    if slos.get("max_ttft_ms") is not None:
        parts.append(f"p99 TTFT <= {slos['max_ttft_ms']:g} ms")
    return " and ".join(parts) or "no SLOs"


def _opt(value: Any) -> float | None:
    v = _num(value)
    return None if math.isnan(v) else v


def _int(value: Any) -> int:
    return 0 if value is None or pd.isna(value) else int(value)


# --- commands -----------------------------------------------------------------------------


def _engine_spec(meta: dict[str, Any]) -> EngineSpec | None:
    stored = meta.get("engine_spec") or {}
    known = {k: v for k, v in stored.items() if k in EngineSpec.model_fields}
    try:
        return EngineSpec.model_validate(known)
    except ValueError:
        return None


def _serve_command(meta: dict[str, Any], config: TrialConfig) -> str:
    """`vllm serve MODEL --speculative-config '...'` plus the engine flags it was measured with."""
    from tuner.engine import serve_command

    spec = _engine_spec(meta) or EngineSpec(model=str(
        (meta.get("engine_spec") or {}).get("model") or "MODEL"))
    command = serve_command(spec, config)
    extra = shlex.join(spec.extra_args)
    if extra and extra not in command:
        command += " " + extra
    return command


def _verify_command(meta: dict[str, Any], config: TrialConfig, concurrency: int) -> str:
    """The `tuner bench` line that re-measures one config on the same model and workload."""
    engine = meta.get("engine_spec") or {}
    wl = meta.get("workload") or {}
    parts = ["tuner", "bench", "--model", str(engine.get("model") or "MODEL"),
             "--workload", str(wl.get("name") or "WORKLOAD")]
    for flag, key in (("--dataset-path", "dataset_path"), ("--num-prompts", "num_prompts"),
                      ("--output-len", "output_len"), ("--max-input-tokens", "max_input_tokens"),
                      ("--category", "category")):
        if wl.get(key) is not None:
            parts += [flag, str(wl[key])]
    if wl.get("seed"):
        parts += ["--seed", str(wl["seed"])]
    if wl.get("temperature"):
        parts += ["--temperature", str(wl["temperature"])]
    if wl.get("name") == "random":
        parts += ["--random-input-len", str(wl.get("random_input_len")),
                  "--random-output-len", str(wl.get("random_output_len"))]
    if wl.get("ignore_eos"):
        parts.append("--ignore-eos")
    if wl.get("skip_chat_template"):
        parts.append("--skip-chat-template")
    # FLAG=VALUE: argparse would take a value that starts with "--" for another flag.
    if engine.get("vllm_cmd"):
        parts.append("--vllm-cmd=" + shlex.join(engine["vllm_cmd"]))
    engine_args = list(engine.get("extra_args") or []) + engine_flags(config)
    if engine_args:
        parts.append("--engine-args=" + shlex.join(engine_args))
    parts += ["--speculative-config",
              config.spec_json() if config.speculative_config else "none",
              "--concurrency", str(concurrency)]
    return shlex.join(parts)

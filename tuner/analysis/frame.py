"""Analysis stage, the frame: the study's trials as a table, read only through the storage
contract (trial attrs "config", "result", "role", "failure", "duplicate_of", ...).

Promises: one row per (trial, concurrency level), failed and unfinished trials kept as rows
with their reason; and a frame with one row per (config, level) whose repeats are pooled
(median and spread). Each row names its config by key; the configs themselves travel with the
frame as records (`configs_of`). Pure functions of what the study stores: no engine, no Optuna
writes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from tuner import intervals
from tuner.records.configs import TrialConfig
from tuner.records.results import LevelMetrics
from tuner.records.storage import TrialAttr
from tuner.records.trials import Role

if TYPE_CHECKING:
    import optuna

# The level's figures as columns; the percentiles a user selected (LevelMetrics.percentiles,
# "p95_tpot_ms", ...) become columns of their own after these. No request_rate: a study's
# trials are measured closed loop (open-loop levels are the policy's, in policy.json).
LEVEL_FIELDS = tuple(f for f in LevelMetrics.model_fields
                     if f not in ("percentiles", "request_rate"))
_PERCENTILE_COLUMN = re.compile(r"^p\d+(\.\d+)?_[a-z]+_ms$")
# Metrics whose run-to-run spread is measured; they are the two objectives of a study.
SPREAD_METRICS = ("output_throughput", "mean_tpot_ms")
# A cell of trials_frame as a trial's attrs hold it: a JSON scalar (a param, a figure, a label)
# or a level's list field (windows, errors, per-position rates).
Cell = str | int | float | bool | Sequence[float] | Sequence[str] | None
# An Optuna param's value (optuna.distributions.CategoricalChoiceType and the numeric ones).
Param = str | int | float | bool | None


@dataclass(frozen=True)
class _TrialColumns:
    """A trial's own cells of trials_frame (TRIAL_COLUMNS, in that order), the same on each of
    its levels' rows."""

    study: str
    trial: int
    state: str
    role: str
    method: str
    label: str
    spec_json: str
    engine_args_json: str
    config_key: str
    # K once, as vLLM resolves it (TrialConfig.k); spec_json and the params are the config's
    # own text, kept for trials.csv.
    num_speculative_tokens: int | None
    duplicate_of: int | None
    reason: str | None
    failure_kind: str | None
    log_tail: str | None
    engine_start_s: float | None
    vllm_version: str | None


TRIAL_COLUMNS = tuple(f.name for f in fields(_TrialColumns))
SPREAD_COLUMNS = (
    "n_measurements", "n_repeats",
    *(f"{m}_{s}" for m in SPREAD_METRICS for s in ("median", "mad")),
)
SPEEDUP_COLUMNS = ("speedup_throughput", "speedup_tpot")
CONFIG_COLUMNS = ("trials", "n_failed")  # configs_frame: a config's launches, failed ones
# df.attrs key of config key -> TrialConfig (configs_of).
CONFIGS_ATTR = "configs"
# df.attrs key of (config key, level) -> each measurement's throughput (launch_throughputs).
RUNS_ATTR = "runs"


# --- the frame ----------------------------------------------------------------------------


def trials_frame(study: optuna.Study) -> pd.DataFrame:
    """One row per (trial, concurrency level); failed and unfinished trials get one row.

    Columns: TRIAL_COLUMNS, the flat Optuna params as `params_<name>`, `concurrency`, every
    LevelMetrics field, and SPREAD_COLUMNS: median and MAD of throughput and TPOT over every
    measurement of the same config (the trial's own result, its "repeats", and other trials of
    the same config that are not copies); NaN when the config was measured once. Each row's
    config is kept as a record in `configs_of(df)`; the study's settings are read apart
    (tuner.search.study.settings_of) and handed to the analysis beside the frame.
    """
    seen = _Trials(study.study_name)
    for t in study.get_trials(deepcopy=False):
        seen.add(t)
    columns = [*TRIAL_COLUMNS, *seen.params, *LEVEL_FIELDS, *seen.percentiles, *SPREAD_COLUMNS]
    df = pd.DataFrame(seen.rows, columns=columns)
    df["trial"] = df["trial"].astype("Int64")
    df["concurrency"] = pd.to_numeric(df["concurrency"]).astype("Int64")
    df["duplicate_of"] = pd.to_numeric(df["duplicate_of"]).astype("Int64")
    _add_spreads(df, seen.pooled)
    df.attrs["study_name"] = study.study_name
    df.attrs[CONFIGS_ATTR] = Configs(seen.configs)
    df.attrs[RUNS_ATTR] = {key: tuple(r[0] for r in runs) for key, runs in seen.pooled.items()}
    return df


class Configs(Mapping[str, TrialConfig]):
    """config key -> TrialConfig, as a frame carries it in df.attrs. The records are frozen,
    so the map is shared, not copied, when pandas copies a frame's attrs."""

    def __init__(self, by_key: Mapping[str, TrialConfig]) -> None:
        self._by_key = dict(by_key)

    def __getitem__(self, key: str) -> TrialConfig:
        return self._by_key[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_key)

    def __len__(self) -> int:
        return len(self._by_key)

    def __deepcopy__(self, memo: dict) -> Configs:
        return self


def launch_throughputs(df: pd.DataFrame, concurrency: int) -> dict[str, tuple[float, ...]]:
    """Each config's output throughput at `concurrency`, one figure per measurement (its
    launches and their repeats, copies answered from storage left out), by config key: what a
    speedup's interval is computed from (tuner.intervals). Empty for a frame built by hand."""
    runs = df.attrs.get(RUNS_ATTR) or {}
    return {key: values for (key, level), values in runs.items() if level == concurrency}


def launch_windows(df: pd.DataFrame, concurrency: int
                   ) -> dict[str, tuple[intervals.LaunchWindows, ...]]:
    """Each config's windows at `concurrency` (LevelMetrics.windows, with the prompts digest of
    the requests they hold), one entry per launch of a completed trial, copies answered from
    storage left out: what pairs a speedup's windows (tuner.intervals.Within)."""
    out: dict[str, list[intervals.LaunchWindows]] = {}
    if "windows" not in df.columns:
        return {}
    rows = df[(df["concurrency"] == concurrency).fillna(False) & (df["state"] == "COMPLETE")
              & df["duplicate_of"].isna()]
    for _, r in rows.iterrows():
        windows, digest = r.get("windows"), r.get("prompts_digest")
        if isinstance(windows, (tuple, list)) and windows:
            out.setdefault(str(r["config_key"]), []).append(
                (digest if isinstance(digest, str) else None, tuple(windows)))
    return {k: tuple(v) for k, v in out.items()}


def configs_of(df: pd.DataFrame) -> Mapping[str, TrialConfig]:
    """The configs of a frame of trials_frame (or one derived from it), by `config_key`."""
    try:
        return df.attrs[CONFIGS_ATTR]
    except KeyError:
        raise ValueError("This frame carries no configs: build it with trials_frame (a frame "
                         "derived from one keeps them in df.attrs).") from None


@dataclass
class _Trials:
    """The rows of trials_frame as its trials are read, and what the columns need."""

    study_name: str
    rows: list[dict[str, Cell]] = field(default_factory=list)
    # (config key, level) -> (throughput, TPOT) of every measurement that is not a copy
    pooled: dict[tuple[str, int], list[tuple[float, float]]] = field(default_factory=dict)
    params: dict[str, None] = field(default_factory=dict)  # `params_<name>` columns, in order
    percentiles: dict[str, None] = field(default_factory=dict)  # chosen percentile columns
    configs: dict[str, TrialConfig] = field(default_factory=dict)

    def add(self, t: Any) -> None:
        # A trial not asked yet (WAITING) has only what was enqueued: an override or fixed
        # params.
        fixed = (getattr(t, "system_attrs", None) or {}).get("fixed_params") or {}
        stored = t.user_attrs.get(TrialAttr.CONFIG) or t.user_attrs.get(TrialAttr.CONFIG_OVERRIDE)
        config = _in_key_order(_trial_config(stored, {**fixed, **t.params}))
        self.configs[config.key()] = config
        own = _trial_columns(t, self.study_name, config)
        params: dict[str, Param] = {}
        for name, value in t.params.items():
            self.params[f"params_{name}"] = None
            params[f"params_{name}"] = value
        result = t.user_attrs.get(TrialAttr.RESULT) if t.state.name == "COMPLETE" else None
        levels = [LevelMetrics.migrate(lv) for lv in (result or {}).get("levels", [])
                  if isinstance(lv, dict)]
        if not levels:
            self.rows.append({**asdict(own), **params})
            return
        for lv in levels:
            chosen = {k: v for k, v in (lv.get("percentiles") or {}).items()
                      if k not in LevelMetrics.model_fields}
            self.percentiles.update(dict.fromkeys(chosen))
            self.rows.append({**asdict(own), **params, **{f: lv.get(f) for f in LEVEL_FIELDS},
                              **chosen})
        if own.duplicate_of is None:  # a copy would count the same measurement twice
            repeats = t.user_attrs.get(TrialAttr.REPEATS) or []
            self._pool(own.config_key, [levels, *(r for r in repeats if isinstance(r, list))])

    def _pool(self, key: str, runs: list[list[Any]]) -> None:
        for run in runs:
            for lv in run:
                if isinstance(lv, dict) and lv.get("concurrency") is not None:
                    self.pooled.setdefault((key, int(lv["concurrency"])), []).append(
                        (number(lv.get("output_throughput")), number(lv.get("mean_tpot_ms"))))


def _add_spreads(df: pd.DataFrame, pooled: dict[tuple[str, int], list[tuple[float, float]]]
                 ) -> None:
    """SPREAD_COLUMNS in place: each row's measurement count and, where its config was
    measured more than once at its level, the median and MAD of throughput and TPOT."""
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


def _trial_columns(t: Any, study_name: str, config: TrialConfig) -> _TrialColumns:
    attrs = t.user_attrs
    failure = attrs.get(TrialAttr.FAILURE) or {}
    result = attrs.get(TrialAttr.RESULT) or {}
    engine = result.get("engine") or {} if isinstance(result, dict) else {}
    state = t.state.name
    # A failure's own text ("" where it recorded none); tuner.outputs words the other states.
    reason = str(failure.get("reason") or "") if state == "FAIL" else None
    return _TrialColumns(
        study=study_name, trial=t.number, state=state,
        role=attrs.get(TrialAttr.ROLE, Role.SEARCH.value), method=config.method,
        label=str(attrs.get(TrialAttr.LABEL) or config.label()), spec_json=config.spec_json(),
        engine_args_json=json.dumps(config.engine_args, sort_keys=True),
        config_key=config.key(), num_speculative_tokens=config.k,
        duplicate_of=attrs.get(TrialAttr.DUPLICATE_OF), reason=reason,
        failure_kind=failure.get("kind") if state == "FAIL" else None,
        log_tail=failure.get("log_tail") if state == "FAIL" else None,
        engine_start_s=engine.get("start_s"), vllm_version=engine.get("vllm_version"))


def _trial_config(stored: Any, params: Mapping[str, Param]) -> TrialConfig:
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


def _in_key_order(config: TrialConfig) -> TrialConfig:
    """The config with every mapping in key order, as spec_json writes it: what is built from
    the frame's records (recommendation.json, the serve files, policy.json) lists a config the
    same way whatever order the search stored it in."""
    def ordered(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: ordered(value[k]) for k in sorted(value)}
        return [ordered(v) for v in value] if isinstance(value, list) else value

    return config.model_copy(update={
        "speculative_config": ordered(config.speculative_config),
        "engine_args": ordered(config.engine_args), "engine_env": ordered(config.engine_env)})


def number(value: Any) -> float:
    """A cell as a float: NaN for None and anything not a number."""
    try:
        return float(value) if value is not None else math.nan
    except (TypeError, ValueError):
        return math.nan


def optional(value: Any) -> float | None:
    """A cell as a float, or None where it is missing or not a number (as JSON carries it)."""
    v = number(value)
    return None if math.isnan(v) else v


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
    rows: list[pd.Series] = []
    for _, group in launched.groupby("config_key", sort=False, dropna=False):
        group = group.sort_values(["trial", "concurrency"], kind="stable")
        extra = pd.Series({
            "trials": json.dumps(sorted({int(t) for t in group["trial"].dropna()})),
            "n_failed": int(group.loc[group["state"] == "FAIL", "trial"].nunique())},
            dtype=object)
        done = group[(group["state"] == "COMPLETE") & group["concurrency"].notna()]
        if done.empty:
            rows.append(pd.concat([group.iloc[-1], extra]))
            continue
        for _, level in done.groupby("concurrency", sort=True):
            row = pd.concat([level.iloc[0], extra])
            if len(level) > 1:
                for f in numeric:
                    row[f] = level[f].median()
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


def levels_of(df: pd.DataFrame, asked: Sequence[int] = ()) -> list[int]:
    """The study's concurrency levels: those it was asked for, and any that were measured."""
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

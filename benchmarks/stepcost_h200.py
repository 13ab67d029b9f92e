"""Step-cost models side by side on H200 n-gram launches (no GPU needed here).

Two data sets (each folder's SOURCE.md says how it was measured):

- benchmarks/data/h200-stop15 (the default): twelve `tuner bench` launches of
  `scripts/gpu_bench.sh benchmarks/gpu/stepcost.list` (64 prompts x 128 tokens, c=1,8,32):
  baseline and aligned baseline at the start and again at the end, the two calibration configs
  a replay study launches (k=8 window 1-2, the heaviest drafter; k=8 window 6-6, the least
  uniform), then six configs no fit sees.
- benchmarks/data/h200-stop14 (`--data`): one `tuner optimize --strategy replay` study
  (32 prompts x 128 tokens, c=1,8,32; 10 launches: baseline x2, aligned baseline x2, two
  calibrations, two predicted leaders x2) and three configs measured afterwards with
  `tuner bench`.

Both are SmolLM2-135M on vLLM 0.26.0, instructcoder, with every launch's token ids. Both
models are fitted on the launches a replay study fits them on (the aligned baseline and the
calibration launches, medians of repeats), then predict every other measured config from the
baseline's tokens:

- line:  step = a + b x tokens scored (the engine's CUDA graph mode ignored);
- plane: step = a + b x tokens scored + m where a step is not uniform (tuner.replay.cost; the
         engines logged CUDAGraphMode.FULL_AND_PIECEWISE).

Both are played out step by step (tuner.replay.schedule) and fitted through the anchor, as
this checkout's predictor does. Printed: each fit, then per config and level the predicted
and measured output throughput and their error under both models, then the median and worst
absolute error per level over the configs no model was fitted on. Acceptance length is
printed beside vLLM's counter.

    .venv/bin/python benchmarks/stepcost_h200.py [--data benchmarks/data/h200-stop14]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import pandas as pd

from tuner.records import BenchResult, LevelMetrics, TrialConfig
from tuner.replay.predict import MeasuredTrial, Prediction, predict
from tuner.tokens import TokenCapture

GRAPHS = "FULL_AND_PIECEWISE"  # what every launch's config line stated (engine_paths.txt)


def load_study(data: Path, *, graphs: str | None) -> list[MeasuredTrial]:
    """The study's launches as the predictor takes them (a repeat carries its original's role)."""
    raw = pd.read_csv(data / "trials_raw.csv")
    fields = set(LevelMetrics.model_fields)
    out, role_of = [], {}
    for number, rows in raw.groupby("trial"):
        rows = rows[rows["concurrency"].notna()]
        first = rows.iloc[0]
        spec = json.loads(first["spec_json"]) if isinstance(first["spec_json"], str) else None
        args = json.loads(first["engine_args_json"]) if isinstance(first["engine_args_json"],
                                                                    str) else {}
        config = TrialConfig(speculative_config=spec, engine_args=args)
        role = first["role"]
        if role == "repeat":
            role = role_of[config.key()]
        role_of.setdefault(config.key(), role)
        levels = {}
        for _, row in rows.iterrows():
            d = {k: (None if isinstance(v, float) and math.isnan(v) else v)
                 for k, v in row.items() if k in fields}
            d.update(concurrency=int(row["concurrency"]), num_requests=int(row["num_requests"]))
            for k in ("spec_decode_per_position_acceptance_rates", "errors"):
                d[k] = tuple(json.loads(d[k])) if isinstance(d.get(k), str) else ()
            levels[d["concurrency"]] = LevelMetrics.model_validate(d)
        out.append(MeasuredTrial(int(number), config, role, levels,
                                 TokenCapture.load(data / "tokens" / f"{number}.npz"),
                                 cudagraph_mode=graphs if spec else None))
    return out


def load_launches(data: Path, *, graphs: str | None) -> list[MeasuredTrial]:
    """A gpu_bench.sh set (launches.list beside one folder per launch) as the predictor takes
    it: base* the baseline, aligned* the aligned baseline, the first two speculative launches
    the calibration, the rest measured only to be predicted."""
    out: list[MeasuredTrial] = []
    fields = set(BenchResult.model_fields)
    for line in (data / "launches.list").read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, spec, args, _env = line.split("|")
        raw = json.loads((data / name / "result.json").read_text())
        result = BenchResult.model_validate({k: v for k, v in raw.items() if k in fields})
        config = TrialConfig(speculative_config=None if spec == "none" else json.loads(spec),
                             engine_args={"no_async_scheduling": True} if args else {})
        speculative = [m for m in out if m.speculative]
        role = ("aligned_baseline" if name.startswith("aligned") else
                "baseline" if name.startswith("base") else
                "calibration" if len(speculative) < 2 else "search")
        out.append(MeasuredTrial(len(out), config, role,
                                 {lv.concurrency: lv for lv in result.levels},
                                 TokenCapture.load(data / name / "tokens.npz"),
                                 cudagraph_mode=graphs if config.speculative_config else None))
    return out


def load_bench(data: Path) -> dict[str, dict[int, dict]]:
    """The configs measured after the study: config key -> level -> vLLM bench fields."""
    out = {}
    for line in (data / "bench" / "index.txt").read_text().splitlines():
        name, spec = line.split(" ", 1)
        result = json.loads((data / "bench" / f"{name}.json").read_text())
        key = TrialConfig(speculative_config=json.loads(spec)).key()
        out[key] = {lv["max_concurrency"]: lv for lv in result["levels"]}
    return out


def run(data: Path, graphs: str | None) -> tuple[Prediction, dict[str, dict[int, dict]]]:
    if (data / "launches.list").exists():
        study = load_launches(data, graphs=graphs)
        bench: dict[str, dict[int, dict]] = {}  # measured figures: predict's own rows
        base = next(m.capture for m in study if m.role == "baseline")
        configs = {m.config.key(): m.config for m in study if m.speculative}
        return predict(base, list(configs.values()), study, max_model_len=4096,
                       max_num_seqs=256), bench
    study = load_study(data, graphs=graphs)
    bench = load_bench(data)
    base = next(m.capture for m in study if m.role == "baseline")
    configs = {m.config.key(): m.config for m in study if m.speculative}
    configs.update({c.key(): c for c in _bench_configs(data)})
    pred = predict(base, list(configs.values()), study, max_model_len=4096, max_num_seqs=256)
    return pred, bench


def _bench_configs(data: Path) -> list[TrialConfig]:
    return [TrialConfig(speculative_config=json.loads(line.split(" ", 1)[1]))
            for line in (data / "bench" / "index.txt").read_text().splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "h200-stop15")
    args = ap.parse_args()
    preds = {name: run(args.data, graphs) for name, graphs in (("line", None), ("plane", GRAPHS))}
    for name, (pred, _) in preds.items():
        print(f"{name} model, fitted on the aligned baseline and the calibration launches:")
        for c in sorted(pred.costs):
            print("  " + pred.costs[c].describe())
    print(f"\n{'config':24} {'c':>2} {'AL pred':>7} {'AL meas':>7} {'meas tok/s':>10} "
          f"{'line':>8} {'err':>7} {'plane':>8} {'err':>7}  fitted on it")
    errors: dict[str, dict[int, list[float]]] = {"line": {}, "plane": {}}
    line_rows = {(r["key"], r["concurrency"]): r for r in preds["line"][0].rows}
    bench = preds["plane"][1]
    for r in preds["plane"][0].rows:
        if r["method"] == "none":
            continue
        c, key = r["concurrency"], r["key"]
        measured = bench.get(key, {}).get(c, {}).get("output_throughput") or \
            r["meas_output_throughput"]
        meas_al = bench.get(key, {}).get(c, {}).get("spec_decode_acceptance_length") or \
            r["meas_acceptance_length"]
        old = line_rows[(key, c)]
        cells = []
        for name, row in (("line", old), ("plane", r)):
            p = row["pred_output_throughput"]
            err = 100.0 * (p / measured - 1) if p and measured else math.nan
            if not row["calibration"] and not math.isnan(err):
                errors[name].setdefault(c, []).append(err)
            cells.append(f"{p:8.1f} {err:+6.1f}%")
        print(f"{r['label']:24} {c:>2} {r['acceptance_length']:7.2f} {meas_al:7.2f} "
              f"{measured:10.1f} {cells[0]} {cells[1]}  {'yes' if r['calibration'] else '-'}")
    print("\nout of sample (configs neither model was fitted on), |error| of output throughput:")
    for c in sorted(errors["plane"]):
        parts = []
        for name in ("line", "plane"):
            e = [abs(x) for x in errors[name].get(c, [])]
            parts.append(f"{name} median {statistics.median(e):5.1f}% worst {max(e):5.1f}%")
        print(f"  c={c:>2} ({len(errors['plane'][c])} configs): " + " | ".join(parts))


if __name__ == "__main__":
    main()

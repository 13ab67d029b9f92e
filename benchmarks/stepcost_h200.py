"""Step-cost models side by side on stored H200 n-gram launches (no GPU needed here).

Reads one folder of benchmarks/data/h200 (its SOURCE.md says how it was measured):
`stepcost-64p` (the default; `tuner bench` launches of benchmarks/gpu/stepcost.list, one folder
each beside launches.list) or `ngram-study-32p` (a `tuner optimize --strategy replay` study's
trials_raw.csv and token ids, and three configs measured after it with `tuner bench`).

Both models are fitted on the launches a replay study fits them on (the aligned baseline and
the calibration launches, medians of repeats), played out step by step (tuner.replay.schedule),
then predict every other measured config from the baseline's tokens:

- line:  step = a + b x tokens scored (the engine's CUDA graph mode ignored);
- plane: step = a + b x tokens scored + m where a step is not uniform (tuner.replay.cost).

Prints each fit; per config and level the predicted and measured acceptance length and output
throughput and both models' errors; then per level the median and worst |error| over the
configs no model was fitted on (docs/accuracy.md tabulates them for every stored set).

    .venv/bin/python benchmarks/stepcost_h200.py [--data benchmarks/data/h200/ngram-study-32p]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

import pandas as pd

from tuner.outputs import decision_words
from tuner.records.configs import TrialConfig
from tuner.records.results import BenchResult, LevelMetrics
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import Prediction, predict
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


def compare(data: Path) -> tuple[dict[str, Prediction], list[dict],
                                 dict[str, dict[int, list[float]]]]:
    """Both models on the set at `data`: their predictions, one row per speculative config and
    level (label, c, acceptance length predicted and measured, measured throughput, each
    model's prediction and error in %, whether the models were fitted on it), and per model and
    level the errors of the configs neither model was fitted on."""
    preds = {name: run(data, graphs) for name, graphs in (("line", None), ("plane", GRAPHS))}
    errors: dict[str, dict[int, list[float]]] = {"line": {}, "plane": {}}
    line_rows = {(r.key, r.concurrency): r for r in preds["line"][0].rows}
    bench = preds["plane"][1]
    rows = []
    for r in preds["plane"][0].rows:
        if r.method == "none":
            continue
        c, key = r.concurrency, r.key
        measured = bench.get(key, {}).get(c, {}).get("output_throughput") or \
            r.meas_output_throughput
        meas_al = bench.get(key, {}).get(c, {}).get("spec_decode_acceptance_length") or \
            r.meas_acceptance_length
        row = {"label": r.label, "concurrency": c, "al_pred": r.acceptance_length,
               "al_meas": meas_al, "measured": measured, "calibration": r.calibration}
        for name, model_row in (("line", line_rows[(key, c)]), ("plane", r)):
            p = model_row.pred_output_throughput
            err = 100.0 * (p / measured - 1) if p and measured else math.nan
            if not model_row.calibration and not math.isnan(err):
                errors[name].setdefault(c, []).append(err)
            row[name], row[f"{name}_err"] = p, err
        rows.append(row)
    return {name: pred for name, (pred, _) in preds.items()}, rows, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path,
                    default=Path(__file__).parent / "data" / "h200" / "stepcost-64p")
    args = ap.parse_args()
    preds, rows, errors = compare(args.data)
    for name, pred in preds.items():
        print(f"{name} model, fitted on the aligned baseline and the calibration launches:")
        for c in sorted(pred.costs):
            print("  " + decision_words.step_cost_text(pred.costs[c].fit_record()))
    print(f"\n{'config':24} {'c':>2} {'AL pred':>7} {'AL meas':>7} {'meas tok/s':>10} "
          f"{'line':>8} {'err':>7} {'plane':>8} {'err':>7}  fitted on it")
    for r in rows:
        cells = [f"{r[name]:8.1f} {r[f'{name}_err']:+6.1f}%" for name in ("line", "plane")]
        print(f"{r['label']:24} {r['concurrency']:>2} {r['al_pred']:7.2f} {r['al_meas']:7.2f} "
              f"{r['measured']:10.1f} {cells[0]} {cells[1]}  "
              f"{'yes' if r['calibration'] else '-'}")
    print("\nout of sample (configs neither model was fitted on), |error| of output throughput:")
    for c in sorted(errors["plane"]):
        parts = []
        for name in ("line", "plane"):
            e = [abs(x) for x in errors[name].get(c, [])]
            parts.append(f"{name} median {statistics.median(e):5.1f}% worst {max(e):5.1f}%")
        print(f"  c={c:>2} ({len(errors['plane'][c])} configs): " + " | ".join(parts))


if __name__ == "__main__":
    main()

"""Replay accuracy re-fitted on stored CPU launches (no engine): what this checkout's
tuner.replay.predict makes of the launches benchmarks/replay_accuracy.py measured.

Reads benchmarks/data/cpu-replay (one SET.tar.xz per set, or a folder SET/; SOURCE.md there
says how each was measured). The step cost is fitted as the replay strategy fits it (the
baseline and the config that drafts the most per step at the top level, or --calibration;
medians over passes). Per set this prints:

1. packing: per launch and level, measured duration over (sum of request latencies / c);
2. the fit, per config and level the predicted and measured throughput, TPOT and TTFT, the
   acceptance length's error (against vLLM's counters), and a summary: median and worst
   |error| out of sample, and how many exceed the config's own run-to-run spread;
3. step shapes at c=1: the median and mean gap between streamed chunks per tokens scored,
   beside the fitted line.

It only calls `predict()`, so it also runs against another checkout's predictor:

    .venv/bin/python benchmarks/replay_refit.py [--data benchmarks/data/cpu-replay] [SET ...]
    PYTHONPATH=/path/to/other/checkout .venv/bin/python benchmarks/replay_refit.py
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import json
import lzma
import shutil
import statistics
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from tuner.outputs import decision_words
from tuner.records.configs import TrialConfig
from tuner.records.results import BenchResult
from tuner.replay.acceptance import replay
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.tokens import FILE_NAME, TokenCapture

sys.path.insert(0, str(Path(__file__).parent))
from replay_accuracy import CONFIGS  # noqa: E402  (the configs those launches measured)

MAX_MODEL_LEN = 8192  # the embedded default's (no request came near it)


def set_names(data: Path) -> list[str]:
    """The sets under `data`: folders, and archives SET.tar.xz (one per set, as stored)."""
    return sorted({p.name.removesuffix(".tar.xz") for p in data.iterdir()
                   if p.is_dir() or p.name.endswith(".tar.xz")})


def open_set(data: Path, name: str) -> Path:
    """The folder of set `name`: data/name itself, or data/name.tar.xz unpacked into a
    temporary folder (removed at exit). The sets are stored packed: the launches of a set share
    their prompts, which xz finds across files (2.4x smaller than the loose files)."""
    if (data / name).is_dir():
        return data / name
    archive = data / f"{name}.tar.xz"
    if not archive.exists():
        sys.exit(f"replay_refit: no set {name!r} in {data} (sets: {', '.join(set_names(data))})")
    tmp = Path(tempfile.mkdtemp(prefix=f"replay-{name}-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="data")
    return tmp


def launches(root: Path) -> list[tuple[str, TrialConfig, Path]]:
    """(name, config, folder) of every launch of a set, in the order they ran."""
    configs = [TrialConfig(speculative_config=c) for c in CONFIGS]
    out = []
    passes = [root] + sorted(p for p in root.glob("pass*") if p.is_dir())
    for n, sub in enumerate(passes, start=1):
        out.append((f"baseline p{n}", TrialConfig(), sub / "baseline"))
        out += [(f"{i:02d} p{n}", cfg, sub / f"{i:02d}") for i, cfg in enumerate(configs, 1)
                if (sub / f"{i:02d}" / "result.json").exists()]
    return out


def packing(folder: Path) -> dict[int, float]:
    """Per level: measured duration / (sum of request latencies / c)."""
    path = folder / "requests.jsonl.xz"
    if not path.exists():
        return {}
    e2e: dict[int, float] = {}
    for line in lzma.open(path, "rt"):
        r = json.loads(line)
        if not r["warmup"] and r["error"] is None:
            e2e[r["concurrency"]] = e2e.get(r["concurrency"], 0.0) + r["e2e_s"]
    result = BenchResult.model_validate_json((folder / "result.json").read_text())
    return {lv.concurrency: lv.duration / (e2e[lv.concurrency] / lv.concurrency)
            for lv in result.levels if e2e.get(lv.concurrency)}


def capture(folder: Path) -> TokenCapture:
    """A launch's token capture with its chunk gaps, which the stored captures predate: they
    are read from the launch's requests.jsonl.xz (tuner.tokens keeps them in new captures)."""
    cap = TokenCapture.load(folder / FILE_NAME)
    path = folder / "requests.jsonl.xz"
    if not path.exists():
        return cap
    gaps = {(r["concurrency"], r["index"], r["warmup"]): r["chunk_gaps_s"]
            for r in map(json.loads, lzma.open(path, "rt")) if r["error"] is None}
    return TokenCapture(requests=tuple(
        dataclasses.replace(r, chunk_ms=1000.0 * np.asarray(
            gaps.get((r.concurrency, r.index, r.warmup), ()), dtype=np.float32))
        for r in cap.requests))


def refit(root: Path, calibration: list[int] | None = None) -> dict:
    runs = launches(root)
    base_cap = capture(root / "baseline")
    configs = [TrialConfig(speculative_config=c) for c in CONFIGS]
    if calibration:
        calib = {configs[i - 1].key() for i in calibration}
    else:
        first = predict(base_cap, configs, [], max_model_len=MAX_MODEL_LEN, max_num_seqs=256)
        top = max(base_cap.levels())
        calib = {max((r for r in first.rows if r.concurrency == top
                      and r.method != "none"), key=lambda r: r.drafted_per_step).key}
    print("packing (duration / (sum of latencies / c)), per launch:")
    measured = []
    for name, cfg, folder in runs:
        result = BenchResult.model_validate_json((folder / "result.json").read_text())
        role = ("baseline" if not cfg.speculative_config
                else "calibration" if cfg.key() in calib else "search")
        measured.append(MeasuredTrial(len(measured), cfg, role,
                                      {lv.concurrency: lv for lv in result.levels},
                                      capture(folder)))
        pack = packing(folder)
        if pack:
            print(f"  {name:12} {cfg.label()[:44]:44} "
                  + "  ".join(f"c={c} {p:.3f}" for c, p in sorted(pack.items())))
    pred = predict(base_cap, configs, measured, max_model_len=MAX_MODEL_LEN, max_num_seqs=256)
    print("fit:")
    for c in sorted(pred.costs):
        print("  " + decision_words.step_cost_text(pred.costs[c].fit_record()))
    if 1 in pred.costs:
        step_shapes(runs, pred.costs[1])
    print(f"{'config':46} {'c':>2} {'tok/s pred':>10} {'meas':>6} {'err':>7} {'TPOT pred':>9} "
          f"{'meas':>6} {'err':>7} {'TTFT pred':>9} {'meas':>6}")
    errors, al_errors = [], []
    judged: list[tuple[float, float]] = []  # (|error|, the config's own spread) where repeated
    spreads = _spreads(measured)
    for r in pred.rows:
        if r.method == "none":
            continue
        tag = " (calibration)" if r.calibration else ""
        print(f"{(r.label + tag)[:46]:46} {r.concurrency:>2} "
              f"{r.pred_output_throughput:10.1f} {r.meas_output_throughput:6.1f} "
              f"{r.err_output_throughput_pct:+6.1f}% {r.pred_mean_tpot_ms:9.1f} "
              f"{r.meas_mean_tpot_ms:6.1f} {r.err_mean_tpot_pct:+6.1f}% "
              f"{r.pred_mean_ttft_ms:9.0f} {r.meas_mean_ttft_ms:6.0f} "
              f"{r.err_acceptance_length_pct:+6.1f}% {r.alternate_stream_requests:>3}")
        if r.concurrency == 1:
            al_errors.append((r.method, abs(r.err_acceptance_length_pct)))
        if not r.calibration:
            for metric, signed in (("output_throughput", r.err_output_throughput_pct),
                                   ("mean_tpot", r.err_mean_tpot_pct)):
                err = abs(signed)
                errors.append(err)
                spread = spreads.get((r.key, r.concurrency, metric))
                if spread is not None:
                    judged.append((err, spread))
    summary = {"out_of_sample_errors": len(errors),
               "median_abs_err_pct": round(statistics.median(errors), 1),
               "worst_abs_err_pct": round(max(errors), 1),
               "c1_ngram_al_within_3pct": _within(al_errors, "ngram", 3.0),
               "c1_suffix_al_within_10pct": _within(al_errors, "suffix", 10.0),
               "errors_beyond_own_spread": f"{sum(e > sp for e, sp in judged)}/{len(judged)}"
                                           if judged else "-",
               # the noise floor: half the range of a config's runs over their median is about
               # how far an exact predictor would land from the median of two runs
               "own_spread_median_pct": round(statistics.median(sp for _, sp in judged), 1)
                                        if judged else None,
               "own_spread_worst_pct": round(max(sp for _, sp in judged), 1) if judged else None}
    print(f"summary: {json.dumps(summary)}")
    return summary


def step_shapes(runs: list[tuple[str, TrialConfig, Path]], line) -> None:
    """Section 3: median chunk gap per tokens scored at c=1 against the fitted line."""
    gaps: dict[tuple[bool, int], list[float]] = {}  # (speculative, n) -> gaps, ms
    for _name, cfg, folder in runs:
        path = folder / "requests.jsonl.xz"
        if not path.exists():
            continue
        recs = sorted((r for r in map(json.loads, lzma.open(path, "rt"))
                       if r["concurrency"] == 1 and not r["warmup"] and r["error"] is None),
                      key=lambda r: r["index"])
        spec = cfg.speculative_config
        if spec:
            cap = TokenCapture.load(folder / FILE_NAME)
            drafts = replay(cap, cfg, max_model_len=MAX_MODEL_LEN, levels=[1])[1].request_drafts
        else:
            drafts = [[0] * len(r["chunk_gaps_s"]) for r in recs]
        for r, d in zip(recs, drafts, strict=True):
            if len(d) != len(r["chunk_gaps_s"]):  # chunks coalesced: not one step each
                continue
            for steps_d, gap in zip(d, r["chunk_gaps_s"], strict=True):
                gaps.setdefault((bool(spec), 1 + int(steps_d)), []).append(1000.0 * gap)
    print("step shapes at c=1 (median and mean gap between streamed chunks, ms, [steps]; "
          "n = tokens the step scored; the line is fitted on means):")
    for n in sorted({n for _, n in gaps}):
        cells = [f"{label} {statistics.median(v):5.1f} {statistics.fmean(v):5.1f} [{len(v):4d}]"
                 if (v := gaps.get((s, n))) else f"{label}   -     -   [   0]"
                 for s, label in ((False, "baseline"), (True, "speculative"))]
        if len(gaps.get((True, n), [])) + len(gaps.get((False, n), [])) >= 10:
            print(f"  n={n:2d}  {cells[0]}  {cells[1]}  line {line.step_ms(n):5.1f}")


def _spreads(measured: list[MeasuredTrial]) -> dict[tuple[str, int, str], float]:
    """Per (config key, level, metric): half the range of its runs over their median, %
    (throughput and mean TPOT apart: at c=4 a config's mean TPOT moved up to 46% between two
    runs whose throughput moved 3%, as prefills stalled other requests or did not)."""
    runs: dict[tuple[str, int, str], list[float]] = {}
    for m in measured:
        for c, lv in m.levels.items():
            runs.setdefault((m.config.key(), c, "output_throughput"), []).append(
                lv.output_throughput)
            runs.setdefault((m.config.key(), c, "mean_tpot"), []).append(lv.mean_tpot_ms)
    return {k: 50.0 * (max(v) - min(v)) / statistics.median(v)
            for k, v in runs.items() if len(v) > 1 and statistics.median(v) > 0}


def _within(errors: list[tuple[str, float]], method: str, bound: float) -> str:
    mine = [e for m, e in errors if m == method]
    return f"{sum(e <= bound for e in mine)}/{len(mine)}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sets", nargs="*", help="set folders under --data (default: all)")
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "cpu-replay")
    ap.add_argument("--calibration", default="",
                    help="calibration configs by number in CONFIGS, e.g. 7,10 (default: the one "
                         "that drafts the most per step at the top level, as the strategy)")
    args = ap.parse_args()
    calibration = [int(x) for x in args.calibration.split(",") if x]
    names = args.sets or set_names(args.data)
    summaries = {}
    for name in names:
        print(f"== {name}")
        summaries[name] = refit(open_set(args.data, name), calibration)
    print("== all sets")
    for name, s in summaries.items():
        print(f"  {name:28} median |error| {s['median_abs_err_pct']:5.1f}%  worst "
              f"{s['worst_abs_err_pct']:5.1f}%  ({s['out_of_sample_errors']} errors); c=1 mean "
              f"acceptance length: n-gram {s['c1_ngram_al_within_3pct']} within 3%, suffix "
              f"{s['c1_suffix_al_within_10pct']} within 10%; errors beyond the config's own "
              f"run-to-run spread in that metric: {s['errors_beyond_own_spread']} (the "
              f"spreads themselves: median {s['own_spread_median_pct']}%, worst "
              f"{s['own_spread_worst_pct']}%)")


if __name__ == "__main__":
    main()

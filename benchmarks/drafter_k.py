"""How close does one launch of a model-based drafter at K_max come to launches at smaller K?
(tuner.replay.drafter_k, issue 49)

`run` launches `tuner bench` once per K (the baseline, K_max, then the smaller K) with the
same workload and levels, each in DIR/k<K>, and keeps each launch's wall time in
DIR/launches.json. `analyze` reads them back and predicts every K from K_max two ways: from
the one launch (the drafter's fixed cost per step not calibrated) and with the launch at the
smallest K calibrating it; it prints predicted against measured acceptance length and
throughput per K and level, and writes them as CSV.

    .venv/bin/python benchmarks/drafter_k.py run --out DIR --draft MODEL_DIR [--ks 5,1,2,3]
        [--reuse-baseline OTHER/k0]
    .venv/bin/python benchmarks/drafter_k.py analyze DIR [--csv OUT.csv]
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tuner.records.results import BenchResult
from tuner.replay.drafter_launches import drafter_axes
from tuner.replay.measured import MeasuredTrial

FIELDS = ("scheme", "concurrency", "k", "source_k", "fitted", "pred_acceptance_length",
          "pred_acceptance_length_se", "meas_acceptance_length", "err_acceptance_length_pct",
          "acceptance_accuracy_pct", "pred_output_throughput", "meas_output_throughput",
          "err_output_throughput_pct", "step_ms", "fixed_ms", "per_token_ms")


def run(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    walls = {}
    if args.reuse_baseline:  # the same workload and levels: one baseline serves both drafters
        shutil.copytree(args.reuse_baseline, out / "k0", dirs_exist_ok=True)
    for k in [*([] if args.reuse_baseline else [0]), *args.ks]:
        spec = ({"method": "draft_model", "model": args.draft, "num_speculative_tokens": k}
                if k else None)
        cmd = [sys.executable, "-m", "tuner", "bench", "-q", "--output-dir", str(out / f"k{k}"),
               "--workload", args.workload, "--num-prompts", str(args.num_prompts),
               "--num-requests", str(args.num_requests), "--output-len", str(args.output_len),
               "--concurrency", args.concurrency,
               "--speculative-config", json.dumps(spec) if spec else "none",
               *(["--model", args.model] if args.model else []), *args.bench_args]
        t0 = time.monotonic()
        subprocess.run(cmd, check=True)
        walls[k] = round(time.monotonic() - t0, 1)
        print(f"K={k}: {walls[k]} s", flush=True)
        (out / "launches.json").write_text(json.dumps(
            {"command": cmd, "wall_s": walls}, indent=2) + "\n")


def launches(root: Path) -> dict[int, MeasuredTrial]:
    """K -> the launch stored in ROOT/k<K>/result.json (0: the baseline)."""
    out = {}
    for i, path in enumerate(sorted(root.glob("k*/result.json"))):
        doc = json.loads(path.read_text())
        result = BenchResult.model_validate({k: v for k, v in doc.items()
                                             if k in BenchResult.model_fields})
        k = result.config.k or 0
        out[k] = MeasuredTrial(number=i, config=result.config,
                               role="baseline" if not k else "search",
                               levels={lv.concurrency: lv for lv in result.levels})
    return out


def rows(root: Path) -> list[dict]:
    got = launches(root)
    levels = sorted({c for m in got.values() for c in m.levels})
    out = []
    for scheme, calibrate in (("one_launch", False), ("calibrated_smallest_k", True)):
        for ax in drafter_axes(list(got.values()), {}, levels, max_num_seqs=256,
                               calibrate=calibrate):
            costs = {c.concurrency: c for c in ax.costs}
            for p in ax.points:
                cost = costs.get(p.concurrency)
                out.append(dict(
                    scheme=scheme, concurrency=p.concurrency, k=p.k, source_k=ax.source_k,
                    fitted=p.fitted, pred_acceptance_length=p.acceptance_length,
                    pred_acceptance_length_se=p.acceptance_length_se,
                    meas_acceptance_length=p.meas_acceptance_length,
                    err_acceptance_length_pct=p.err_acceptance_length_pct,
                    acceptance_accuracy_pct=p.acceptance_accuracy_pct,
                    pred_output_throughput=p.output_throughput,
                    meas_output_throughput=p.meas_output_throughput,
                    err_output_throughput_pct=p.err_output_throughput_pct, step_ms=p.step_ms,
                    fixed_ms=cost.fixed_ms if cost else None,
                    per_token_ms=cost.per_token_ms if cost else None))
    return out


def analyze(args: argparse.Namespace) -> None:
    root = Path(args.dir)
    table = rows(root)
    walls = json.loads((root / "launches.json").read_text())["wall_s"] \
        if (root / "launches.json").is_file() else {}

    def f(v: float | None, fmt: str) -> str:
        return "" if v is None else fmt.format(v)

    print(f"{'scheme':22} {'c':>2} {'K':>2} {'acc pred (SE)':>14} {'acc meas':>8} {'err':>7} "
          f"{'allowed':>7} {'tok/s pred':>10} {'tok/s meas':>10} {'err':>7}")
    for r in table:
        mark = "*" if r["fitted"] else " "
        print(f"{r['scheme']:22} {r['concurrency']:>2} {r['k']:>2}{mark}"
              f"{r['pred_acceptance_length']:>7.3f} ({r['pred_acceptance_length_se']:.3f})"
              f" {f(r['meas_acceptance_length'], '{:.3f}'):>8}"
              f" {f(r['err_acceptance_length_pct'], '{:+.1f}%'):>7}"
              f" {r['acceptance_accuracy_pct']:>6.1f}%"
              f" {f(r['pred_output_throughput'], '{:.2f}'):>10}"
              f" {f(r['meas_output_throughput'], '{:.2f}'):>10}"
              f" {f(r['err_output_throughput_pct'], '{:+.1f}%'):>7}")
    print("* the step cost was fitted on this launch (its throughput error is in-sample)")
    if walls:
        print("launch wall time (s): " + ", ".join(f"K={k}: {v}" for k, v in walls.items()))
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS)
            w.writeheader()
            w.writerows(table)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="launch tuner bench at the baseline and each K")
    r.add_argument("--out", required=True)
    r.add_argument("--draft", required=True, help="the draft model's folder")
    r.add_argument("--model", default=None, help="the target (default: the embedded one)")
    r.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[5, 1, 2, 3],
                   help="K_max first, then the K it predicts that are launched to check it")
    r.add_argument("--reuse-baseline", default=None,
                   help="a baseline launch folder (another set's k0) to copy, not launch")
    r.add_argument("--workload", default="instructcoder")
    r.add_argument("--num-prompts", type=int, default=24)
    r.add_argument("--num-requests", type=int, default=8)
    r.add_argument("--output-len", type=int, default=64)
    r.add_argument("--concurrency", default="1,4")
    r.add_argument("bench_args", nargs="*", help="after --: more tuner bench flags")
    a = sub.add_parser("analyze", help="predicted against measured, from the stored launches")
    a.add_argument("dir")
    a.add_argument("--csv", default=None)
    args = p.parse_args()
    run(args) if args.cmd == "run" else analyze(args)


if __name__ == "__main__":
    main()

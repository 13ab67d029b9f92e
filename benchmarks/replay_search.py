"""Search cost: the replay strategy against the TPE study, side by side, then check launches.

1. `tuner optimize --strategy replay` and `tuner optimize --strategy optuna` (TPE, seed 0) on
   the same workload and settings (the README's main job unless told otherwise), each with
   --n-trials launches; printed: launches, wall time, the c=1 recommendation of each.
2. Check launches on one engine setup, c=1 only: each study's pick, then CHECKS other
   configs of the space (the replay's next best predictions and seeded random ones, none of
   them a pick), the whole round CHECK_RUNS times. Printed:
   every config's measured output throughput and its ratio to the best of the checks, and
   whether each pick is within 3% of that best. A difference below the picks' own run-to-run
   spread (printed) is not a finding.

    .venv/bin/python benchmarks/replay_search.py [--n-trials 6] [--checks 10]
        [--check-runs 2] [--out outputs/replay-search]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from tuner import api, engine_cmdline
from tuner.measure import trial, workloads
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import EngineOptions

COMMON = ["--workload", "instructcoder", "--num-prompts", "4", "--output-len", "64",
          "--concurrency", "1,4", "--requests-per-slot", "2"]


def study(name: str, strategy: str, n_trials: int, out: Path) -> dict:
    folder = out / name
    argv = [sys.executable, "-m", "tuner", "optimize", *COMMON, "--strategy", strategy,
            "--n-trials", str(n_trials), "--study-name", name, "--output-dir", str(folder)]
    t0 = time.monotonic()
    log = out / f"{name}.log"
    with open(log, "w") as f:
        rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - t0
    rec = json.loads((folder / "recommendation.json").read_text())
    raw = pd.read_csv(folder / "trials_raw.csv")
    # one row per trial and level; answers from storage (duplicate_of) launched nothing
    launched = raw[raw["state"].isin(["COMPLETE", "FAIL"]) & raw["duplicate_of"].isna()]
    launches = launched["trial"].nunique()
    level = next(lv for lv in rec["levels"] if lv["concurrency"] == 1)
    print(f"{name}: exit {rc}, {launches} launches, {wall / 60:.1f} min; c=1 pick: "
          f"{level.get('label')} ({level.get('status')}, {_x(level.get('speedup_throughput'))}x "
          f"in-study); log {log}", flush=True)
    return {"rc": rc, "launches": int(launches), "wall_s": round(wall), "pick": level,
            "folder": str(folder)}


def _x(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"


def check_configs(replay_folder: Path, picks: list[dict], n: int, seed: int = 0) -> list[dict]:
    """n configs of the space that neither study picked: half the replay's next best
    predictions at c=1, half seeded random picks of the predicted table."""
    pred = pd.read_csv(replay_folder / "predicted.csv")
    pred = pred[(pred["concurrency"] == 1) & (pred["method"] != "none")]
    taken = {json.dumps(p, sort_keys=True) for p in picks}
    rows = [r for r in pred.sort_values("pred_output_throughput", ascending=False)
            .to_dict("records") if r["speculative_config"] not in taken]
    best = rows[:n // 2]
    rest = rows[n // 2:]
    random.Random(seed).shuffle(rest)
    return [json.loads(r["speculative_config"]) for r in best + rest[:n - len(best)]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-trials", type=int, default=6)
    ap.add_argument("--checks", type=int, default=10)
    ap.add_argument("--check-runs", type=int, default=2,
                    help="how many times the check launches measure every config")
    ap.add_argument("--out", type=Path, default=Path("outputs/replay-search"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"replay": study("bench-replay", "replay", args.n_trials, args.out),
               "tpe": study("bench-tpe", "optuna", args.n_trials, args.out)}
    picks = [r["pick"].get("speculative_config") for r in results.values()]
    picks = [p for p in picks if p]
    checks = check_configs(Path(results["replay"]["folder"]), picks, args.checks)
    engine = api.resolve_engine(EngineOptions())
    spec = WorkloadSpec(name="instructcoder", num_prompts=4, output_len=64)
    ms = MeasureSettings(concurrencies=(1,), requests_per_slot=2)
    wl = workloads.load(spec, tokenizer=engine.tokenizer or engine.model, pool=ms.pool_size(4),
                        max_model_len=engine_cmdline.engine_setting(engine, "max_model_len"),
                        say=print)
    # Every config --check-runs times, round after round, so launch-to-launch noise (10-15%
    # in a config's mean step time on a 2-core CPU host) is not read as a ranking.
    first = [("replay pick", picks[0]), ("tpe pick", picks[-1])] if picks else []
    sequence = (first + [(f"check {i + 1}", c) for i, c in enumerate(checks)]) * args.check_runs
    measured: dict[str, list[float]] = {}
    labels: dict[str, str] = {}
    for i, (name, cfg) in enumerate(sequence):
        config = TrialConfig(speculative_config=cfg)
        result = trial.measure(engine, config, wl, ms, trial_dir=args.out / "check" / f"{i:02d}")
        thr = result.levels[0].output_throughput
        measured.setdefault(name, []).append(thr)
        labels[name] = config.label()
        print(f"  {name:12} {config.label():50} {thr:6.2f} tok/s", flush=True)
    best = max(statistics.median(v) for v in measured.values())
    print(f"\ncheck launches at c=1: {len(sequence)}; ratio = median / best median")
    for name, values in measured.items():
        spread = (max(values) - min(values)) / 2
        print(f"  {name:12} {labels[name]:50} {statistics.median(values):6.2f} tok/s "
              f"{statistics.median(values) / best:5.3f} of best  (+-{spread:.2f}, "
              f"{len(values)} runs)")
    for name in ("replay pick", "tpe pick"):
        if name in measured:
            ratio = statistics.median(measured[name]) / best
            print(f"{name}: {ratio:.3f} of the checks' best -> "
                  f"{'within' if ratio >= 0.97 else 'NOT within'} 3%")
    (args.out / "summary.json").write_text(json.dumps(
        {"studies": results, "check": measured, "labels": labels}, indent=2, default=str))


if __name__ == "__main__":
    main()

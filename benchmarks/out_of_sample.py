"""Out-of-sample check of a study's predictions, beside the measured spread.

    python benchmarks/out_of_sample.py CHECK_DIR [--study STUDY_DIR]

CHECK_DIR is what scripts/gpu_check_study.sh brings back (results/): `predicted.json`, the
study's replay made before the launches (`tuner predict --json`), and one folder per launched
config with `tuner bench`'s result.json. For each launched config and level it prints the
predicted and measured throughput, TPOT and acceptance length, the prediction's error, and the
noise the error is to be read against: the launch's own window spread (the converging
measurement's ±) and, with --study, the between-launch spread of the study's baseline
(half-range over median of its launches). An error smaller than the spread is not a finding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tuner.records.results import BenchResult


def _pct(pred: float | None, meas: float | None) -> str:
    if not pred or not meas:
        return "-"
    return f"{100 * (pred - meas) / meas:+.1f}%"


def baseline_spread(study_dir: Path) -> dict[int, tuple[float, int]]:
    """Per level: the plain baseline's half-range over median across the study's launches (%)
    and how many launches."""
    from tuner.search import study as st
    from tuner.search import trials

    study = st.open_existing(study_dir, None, None)
    runs: dict[int, list[float]] = {}
    for t in trials.measured_trials(study, study_dir, captures=False):
        if t.role != "baseline":
            continue
        for c, lv in t.levels.items():
            runs.setdefault(c, []).append(lv.output_throughput)
    return {c: (100 * (max(v) - min(v)) / 2 / statistics.median(v), len(v))
            for c, v in runs.items() if len(v) >= 2}


def rows(check_dir: Path) -> list[dict]:
    predicted = json.loads((check_dir / "predicted.json").read_text())["rows"]
    by_key = {(r["key"], r["concurrency"]): r for r in predicted}
    out = []
    for result_path in sorted(check_dir.glob("*/result.json")):
        result = BenchResult.model_validate_json(result_path.read_text())
        key = result.config.key()
        for lv in result.levels:
            p = by_key.get((key, lv.concurrency))
            if p is None:
                continue
            out.append({
                "config": result.config.label(), "c": lv.concurrency,
                "pred_tok_s": p.get("pred_output_throughput"),
                "meas_tok_s": lv.output_throughput,
                "err_tok_s": _pct(p.get("pred_output_throughput"), lv.output_throughput),
                "err_tpot": _pct(p.get("pred_mean_tpot_ms"), lv.mean_tpot_ms),
                "pred_al": p.get("acceptance_length"),
                "meas_al": lv.spec_decode_acceptance_length,
                "err_al": _pct(p.get("acceptance_length"), lv.spec_decode_acceptance_length),
                "window_pm": lv.stability_pct,
                "converged": lv.converged,
            })
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("check_dir", type=Path)
    ap.add_argument("--study", type=Path, help="the study folder, for its baseline's spread")
    args = ap.parse_args()
    spread = baseline_spread(args.study) if args.study else {}
    table = rows(args.check_dir)
    if not table:
        print(f"{args.check_dir}: no launched config matches a predicted row", file=sys.stderr)
        return 1
    print("Out-of-sample: predictions made before these configs were launched "
          "(tuner predict over the study), against `tuner bench` of each.")
    print(f"{'config':44} {'c':>3} {'pred tok/s':>10} {'meas tok/s':>10} {'err':>7} "
          f"{'TPOT err':>8} {'AL err':>7} {'window ±':>8} {'base spread':>12}")
    for r in table:
        win = f"{r['window_pm']:.1f}%" if r["window_pm"] is not None else "-"
        win += "" if r["converged"] in (None, True) else "*"
        base = spread.get(r["c"])
        base_text = f"{base[0]:.1f}% ({base[1]})" if base else "-"
        print(f"{r['config'][:44]:44} {r['c']:>3} {r['pred_tok_s'] or 0:>10.1f} "
              f"{r['meas_tok_s']:>10.1f} {r['err_tok_s']:>7} {r['err_tpot']:>8} "
              f"{r['err_al']:>7} {win:>8} {base_text:>12}")
    errs = [abs(float(r["err_tok_s"].rstrip("%"))) for r in table if r["err_tok_s"] != "-"]
    if errs:
        print(f"throughput error: median {statistics.median(errs):.1f}%, worst {max(errs):.1f}% "
              f"over {len(errs)} config-levels")
    print("window ±: half-range over median of the launch's stable windows (* not converged); "
          "base spread: the study baseline's half-range over median across its launches "
          "(launches).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""How far is the pick from the best config? Measures a grid of configs and the baseline,
N launches each, interleaved, on one seeded draw of the workload (`tuner bench`: every
launch the same requests in the same order), then prints per level each config's measured
speedup (mean throughput over the baseline's, with the launches' min-max), the best one, and
for every study given (tuner optimize folders, e.g. benchmarks/selection_calibration.py's)
its pick's regret: 1 - its measured speedup over the best's.

    python benchmarks/regret_grid.py --studies /tmp/selection-calibration \\
        --launches 3 --seed 1000 --root /tmp/regret-grid --out benchmarks/data/cpu-regret

The grid is GRID below (suffix and n-gram configs across K and window, the tutorial's
`ngram k=5`) plus every study's pick at every level. The studies' levels, prompt count and
output length are the README main job's (MAIN_JOB). The draw is another seed than the
studies', so it shares prompts with their workload samples (the bundled instructcoder file
holds 165): it ranks configs on common requests; `tuner verify` is the out-of-sample check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = ["bench", "--workload", "instructcoder", "--num-prompts", "16", "--output-len", "64",
         "--concurrency", "1,4", "--requests-per-slot", "2", "-q"]
_SUFFIX = {"method": "suffix", "suffix_decoding_max_tree_depth": 32,
           "suffix_decoding_max_spec_factor": 1.5, "suffix_decoding_min_token_prob": 0.25}
GRID = [
    *({**_SUFFIX, "num_speculative_tokens": k} for k in (8, 16, 24, 32)),
    *({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
       "prompt_lookup_max": hi} for k, lo, hi in ((5, 1, 5), (7, 1, 2), (8, 1, 5), (4, 2, 5))),
]


def _key(spec: dict | None) -> str:
    return json.dumps(spec or None, sort_keys=True)


def _picks(studies: Path) -> dict[str, dict[int, dict]]:
    """{study name: {concurrency: its pick's speculative config (None: off)}}."""
    out: dict[str, dict[int, dict]] = {}
    for rec_path in sorted(studies.glob("*/recommendation.json")):
        rec = json.loads(rec_path.read_text())
        for lv in rec.get("levels", []):
            sel = (lv.get("verdict") or {}).get("selection") or {}
            cfg = (sel.get("subject_config") or {}).get("speculative_config") \
                or lv.get("speculative_config")
            out.setdefault(rec_path.parent.name, {})[lv["concurrency"]] = cfg
    return out


def _launch(spec: dict | None, out_dir: Path, seed: int) -> dict[int, float] | None:
    """One `tuner bench` launch: output throughput per level (None: it failed)."""
    args = [*BENCH, "--seed", str(seed), "--output-dir", str(out_dir)]
    if spec:
        args += ["--speculative-config", json.dumps(spec)]
    proc = subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True,
                          text=True)
    result = out_dir / "result.json"
    if proc.returncode != 0 or not result.is_file():
        print(f"  failed ({proc.returncode}): {(proc.stdout + proc.stderr)[-300:]}", flush=True)
        return None
    data = json.loads(result.read_text())
    levels = data.get("levels") or data.get("result", {}).get("levels", [])
    return {int(lv.get("max_concurrency", lv.get("concurrency"))): float(lv["output_throughput"])
            for lv in levels}


def _label(spec: dict | None) -> str:
    if not spec:
        return "baseline"
    if spec["method"] == "ngram":
        return (f"ngram k={spec['num_speculative_tokens']} window "
                f"{spec['prompt_lookup_min']}-{spec['prompt_lookup_max']}")
    knobs = [spec.get(f"suffix_decoding_{k}") for k in ("max_spec_factor", "max_tree_depth",
                                                         "min_token_prob")]
    return f"{spec['method']} k={spec['num_speculative_tokens']} ({', '.join(map(str, knobs))})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--studies", type=Path, default=None)
    p.add_argument("--launches", type=int, default=3)
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--root", type=Path, default=Path("/tmp/regret-grid"))
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--grid", default=None,
                   help="indices of GRID to measure, e.g. 1 (default: all)")
    args = p.parse_args()
    picks = _picks(args.studies) if args.studies else {}
    grid = GRID if args.grid is None else [GRID[int(i)] for i in args.grid.split(",") if i]
    configs = {_key(None): None, **{_key(s): s for s in grid}}
    for levels in picks.values():
        configs.update({_key(s): s for s in levels.values() if s})
    runs: dict[str, list[dict[int, float]]] = {k: [] for k in configs}
    t0 = time.monotonic()
    for n in range(args.launches):  # interleaved: every config once, then again
        for i, (key, spec) in enumerate(configs.items()):
            print(f"launch {n + 1}/{args.launches} {_label(spec)}", flush=True)
            got = _launch(spec, args.root / f"launch{n}-config{i}", args.seed)
            if got:
                runs[key].append(got)
    base = runs[_key(None)]
    levels = sorted({c for r in base for c in r})
    table, lines = [], []
    for c in levels:
        b = statistics.fmean(r[c] for r in base)
        rows = []
        for key, spec in configs.items():
            tps = [r[c] for r in runs[key] if c in r]
            if spec is None or not tps:
                continue
            rows.append({"concurrency": c, "config": spec, "label": _label(spec),
                         "launches": len(tps), "throughput": statistics.fmean(tps),
                         "speedup": statistics.fmean(tps) / b,
                         "speedup_min": min(tps) / b, "speedup_max": max(tps) / b})
        rows.sort(key=lambda r: -r["speedup"])
        table += rows
        best = rows[0]
        lines.append(f"c={c}: baseline {b:.1f} tok/s over {len(base)} launches "
                     f"(min-max {min(r[c] for r in base):.1f}-{max(r[c] for r in base):.1f})")
        lines += [f"  {r['label']:<24} {r['speedup']:.2f}x ({r['speedup_min']:.2f}-"
                  f"{r['speedup_max']:.2f}, {r['launches']} launches)" for r in rows]
        for study, chosen in sorted(picks.items()):
            pick = chosen.get(c)
            mine = next((r for r in rows if _key(r["config"]) == _key(pick)), None)
            if pick is None:
                lines.append(f"  {study}: speculation off; the best measured "
                             f"{best['speedup']:.2f}x")
            elif mine is not None:
                lines.append(f"  {study}: pick {mine['label']} {mine['speedup']:.2f}x, regret "
                             f"{1 - mine['speedup'] / best['speedup']:.1%} against "
                             f"{best['label']}")
    lines.append(f"wall time {(time.monotonic() - t0) / 60:.1f} min, "
                 f"{sum(len(v) for v in runs.values())} launches")
    print("\n".join(lines))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "grid.json").write_text(json.dumps(
            {"seed": args.seed, "launches": args.launches, "bench": BENCH, "rows": table,
             "picks": {s: {str(c): v for c, v in lv.items()} for s, lv in picks.items()},
             "summary": lines}, indent=1) + "\n")


if __name__ == "__main__":
    main()

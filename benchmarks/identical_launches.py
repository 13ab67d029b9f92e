"""The spread of identical launches under the request schedule: each config launched N times,
alternating, every launch sending the same requests (tuner.measure.request_schedule).

`run`: for each launch round, each config once (`tuner bench` in this process: one engine, the
study's schedule for these options), its result.json kept under --out/<config>-<round>/.
`analyze` (also printed after `run`): per config and level, each launch's output throughput,
their median and half-range over the median (in percent: the spread a comparison between two
launches must exceed), the decode time per token likewise, whether every launch measured the
same requests (their prompts digests), and each config's speedup over the baseline per round
(paired: same requests, launched back to back).

    .venv/bin/python benchmarks/identical_launches.py run --out DIR [--launches 3]
        [--concurrency 1,4] [--num-prompts 4] [--output-len 64] [--requests-per-slot 2]
        [--config NAME=JSON ...]
    .venv/bin/python benchmarks/identical_launches.py analyze DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from tuner import api, checks
from tuner.errors import ConfigError
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import BenchOptions, EngineOptions

DEFAULT_CONFIGS = {
    "baseline": None,
    "ngram-k7-w1-2": {"method": "ngram", "num_speculative_tokens": 7, "prompt_lookup_min": 1,
                      "prompt_lookup_max": 2},
}


def run(args: argparse.Namespace) -> None:
    configs = dict(DEFAULT_CONFIGS)
    for item in args.config or []:
        name, _, spec = item.partition("=")
        configs[name] = json.loads(spec) if spec and spec != "none" else None
    workload = WorkloadSpec(name=args.workload, num_prompts=args.num_prompts,
                            output_len=args.output_len)
    settings = MeasureSettings(concurrencies=args.concurrency,
                               requests_per_slot=args.requests_per_slot, stability_pct=3.0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "run.json").write_text(json.dumps({
        "workload": workload.model_dump(), "settings": settings.model_dump(mode="json"),
        "configs": configs, "launches": args.launches,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S")}, indent=2))
    for n in range(1, args.launches + 1):
        for name, spec in configs.items():
            folder = args.out / f"{name}-{n:02d}"
            if (folder / "result.json").is_file():
                continue  # a later call resumes
            print(f"launch {n}/{args.launches}: {name}", file=sys.stderr, flush=True)
            api.bench(BenchOptions(workload=workload, engine=EngineOptions(),
                                   settings=settings,
                                   config=TrialConfig(speculative_config=spec),
                                   out_dir=folder), say=lambda _m: None)
    analyze(args.out)


def _half_range_pct(values: list[float]) -> float:
    return 100.0 * (max(values) - min(values)) / 2 / statistics.median(values)


def analyze(out: Path) -> None:
    meta = json.loads((out / "run.json").read_text())
    results: dict[str, list[dict]] = {}
    for folder in sorted(out.glob("*-[0-9][0-9]")):
        path = folder / "result.json"
        if path.is_file():
            results.setdefault(folder.name.rsplit("-", 1)[0], []).append(json.loads(
                path.read_text()))
    if not results:
        raise ConfigError(f"{out}: no launches measured yet")
    wl, st = meta["workload"], meta["settings"]
    print(f"# identical launches: embedded default, {wl['name']} seed {wl['seed']}, "
          f"{wl['num_prompts']} prompts x {wl['output_len']} tokens, requests per slot "
          f"{st['requests_per_slot']}, temperature 0, each config launched "
          f"{meta['launches']} times alternating; every launch sends the request schedule")
    print("config           level  launches  same requests  tok/s per launch           "
          "median  half-range %  decode ms/token half-range %")
    for name, docs in results.items():
        for c in st["concurrencies"]:
            levels = [lv for d in docs for lv in d["levels"] if lv["max_concurrency"] == c]
            thr = [lv["output_throughput"] for lv in levels]
            decode = [(lv["mean_e2el_ms"] - lv["mean_ttft_ms"]) * lv["completed"]
                      / max(lv["total_output_tokens"] - lv["completed"], 1) for lv in levels]
            same = len({lv.get("prompts_digest") for lv in levels}) == 1
            print(f"{name:<16} c={c:<4} {len(levels):>8}  {'yes' if same else 'NO':>13}  "
                  f"{' '.join(f'{x:.1f}' for x in thr):<25} {statistics.median(thr):7.1f}  "
                  f"{_half_range_pct(thr):12.2f}  {_half_range_pct(decode):12.2f}")
    base = results.get("baseline")
    if not base:
        return
    print("speedup over the baseline launched beside it (round by round), per level:")
    for name, docs in results.items():
        if name == "baseline":
            continue
        for c in st["concurrencies"]:
            ratios = []
            for d, b in zip(docs, base, strict=False):
                x = next(lv["output_throughput"] for lv in d["levels"]
                         if lv["max_concurrency"] == c)
                y = next(lv["output_throughput"] for lv in b["levels"]
                         if lv["max_concurrency"] == c)
                ratios.append(x / y)
            print(f"  {name} c={c}: {' '.join(f'{r:.3f}x' for r in ratios)}; median "
                  f"{statistics.median(ratios):.3f}x, half-range {_half_range_pct(ratios):.2f}%")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--launches", type=int, default=3)
    r.add_argument("--concurrency", type=checks.list_option("concurrency"), default="1,4")
    r.add_argument("--workload", default="instructcoder")
    r.add_argument("--num-prompts", type=int, default=4)
    r.add_argument("--output-len", type=int, default=64)
    r.add_argument("--requests-per-slot", type=int, default=2)
    r.add_argument("--config", action="append", metavar="NAME=JSON",
                   help="another config to launch (JSON speculative config, or none)")
    a = sub.add_parser("analyze")
    a.add_argument("out", type=Path)
    args = ap.parse_args()
    try:
        run(args) if args.command == "run" else analyze(args.out)
    except ConfigError as e:
        print(f"identical_launches: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

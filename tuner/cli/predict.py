"""`tuner predict`: its arguments (TrafficOptions with --traffic) and its run: every config of
a space predicted from a study's baseline tokens, or from a user's own request logs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tuner import api, checks
from tuner.cli.arguments import STUDY_DIR, Renamed, add_storage, sayer
from tuner.errors import ConfigError
from tuner.outputs import console
from tuner.records.options import TrafficOptions

HELP = ("predict every config of a space from a study's baseline tokens, or from your own "
        "request logs (--traffic; replay, no engine)")
_T = TrafficOptions(traffic_path=Path("."))  # the one home of each option's default


_LEVELS_WHY = ("the captured levels to predict; --concurrency is the levels bench and optimize "
               "measure")


def add_arguments(pr: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """Fills TrafficOptions with --traffic (its `from_cli_args`); a study's prediction without."""
    pr.add_argument("study_dir", type=Path, nargs="?", help=STUDY_DIR + " (with --traffic: "
                    "optional, the study that prices it, as --study)")
    pr.add_argument("--space", help=f"built-in space ({names['spaces']}) or YAML path "
                    "(default: the study's; with --traffic, ngram)")
    pr.add_argument("--levels", "--concurrency", action=Renamed, old="--concurrency",
                    why=_LEVELS_WHY, type=checks.list_option("levels", blank=True),
                    help="captured levels to predict, e.g. 1,8 (default: every captured level; "
                    "with --traffic: the closed-loop levels to replay, default 1, also as "
                    "--concurrency; otherwise --concurrency is its old, deprecated name)")
    pr.add_argument("--top", type=checks.option("top"), default=_T.top, help="rows per level")
    pr.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_storage(pr)
    pr.add_argument("--traffic", type=Path, metavar="FILE", help="replay your own request "
                    "logs: JSONL (.gz/.xz) or parquet, one request and its answer a record "
                    "(prompt or messages; completion or completion_token_ids), or a `tuner "
                    "bench` requests.jsonl")
    pr.add_argument("--model", help="with --traffic: the model or its tokenizer (a folder or "
                    "hub id) that tokenizes text (default: the study's, the records' own, or "
                    "the embedded SmolLM2-135M-Instruct)")
    pr.add_argument("--study", type=Path, metavar="DIR", help="with --traffic: a study on the "
                    "target hardware whose step cost prices the traffic (throughput, TPOT, "
                    "speedup)")
    pr.add_argument("--output-dir", type=Path, help="with --traffic: where traffic.csv and "
                    "traffic.json go (default: outputs/traffic-<file stem>)")


def run(args: argparse.Namespace) -> int:
    if args.traffic is not None:
        return _predict_traffic(args)
    traffic_only = [f for f, v in (("--model", args.model), ("--study", args.study),
                                   ("--output-dir", args.output_dir)) if v is not None]
    if traffic_only or args.study_dir is None:
        raise ConfigError(f"tuner predict {' '.join(traffic_only) or 'without STUDY_DIR'}: "
                          "give a study folder (tuner predict STUDY_DIR), or your request "
                          "logs with --traffic FILE (--model, --study and --output-dir go "
                          "with it).")
    levels = args.levels
    pred = api.predict(study_dir=args.study_dir, storage_url=args.storage,
                       study_name=args.study_name, space_name=args.space, levels=levels,
                       say=sayer(args))
    if args.json:
        print(json.dumps({"rows": [r.csv_row() for r in pred.rows],
                          "seconds": round(pred.seconds, 3),
                          "step_cost": {c: console.step_cost_text(s.fit_record()) for c, s in pred.costs.items()},
                          "skipped": pred.skipped, "streams": pred.streams,
                          "temperature": pred.temperature,
                          "drafters": [dataclasses.asdict(a) for a in pred.drafters]}, indent=2,
                         default=str))
        return 0
    print(console.predict_table(pred.rows, top=args.top, levels=levels))
    if pred.drafters:
        print("\n" + console.drafter_axes_text(pred.drafters))
    for c in sorted(pred.costs):
        print("step cost " + console.step_cost_text(pred.costs[c].fit_record()))
    if pred.streams:
        print(pred.streams)
    if not any(s.calibrated for s in pred.costs.values()):
        print("No speculative trial calibrates the step cost yet: acceptance only.")
    for why in pred.skipped:
        print(f"skipped: {why}")
    print(f"{pred.configs} configs predicted in {pred.seconds:.1f} s; measured figures are "
          "medians over the study's trials.", file=sys.stderr)
    return 0


def _predict_traffic(args: argparse.Namespace) -> int:
    if args.study and args.study_dir and args.study != args.study_dir:
        raise ConfigError(f"Two studies given: {args.study_dir} and --study {args.study}. "
                          "Give the one that prices the traffic once.")
    out = api.predict_traffic(TrafficOptions.from_cli_args(args), say=sayer(args))
    if args.json:
        print(json.dumps({"rows": [r.csv_row() for r in out.rows], "notes": out.notes,
                          "seconds": round(out.seconds, 3),
                          "files": {k: str(v) for k, v in out.paths.items()}}, indent=2,
                         default=str))
        return 0
    print(out.table)
    print()
    for line in out.notes:
        print(line)
    print(f"Wrote {out.paths['csv']} and {out.paths['json']}.")
    print(f"{out.configs} configs replayed over {out.requests} requests in {out.seconds:.1f} s.",
          file=sys.stderr)
    return 0

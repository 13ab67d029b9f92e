"""`tuner bench`: its arguments (BenchOptions) and its run: one config measured at every
level in one engine launch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner import api, checks
from tuner.cli.arguments import sayer, show_bar
from tuner.cli.measurement import add_engine, add_measure, add_workload
from tuner.errors import TrialFailed
from tuner.outputs import console
from tuner.records.options import BenchOptions

HELP = "measure one --speculative-config at each concurrency"


def add_arguments(b: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """Fills BenchOptions (its `from_cli_args`)."""
    add_workload(b)
    add_engine(b)
    add_measure(b)
    b.add_argument("--speculative-config", metavar="JSON", type=checks.speculative_config,
                   help="JSON as vLLM takes it, e.g. '{\"method\": \"ngram\", "
                   "\"num_speculative_tokens\": 5}'; method: any method of the installed "
                   "vLLM's SpeculativeConfig, e.g. "
                   # Examples only: listing vLLM's own would import it (seconds) at every start.
                   f"{', '.join(m for m in checks.METHODS if m != 'none')}; 'none' = baseline")
    b.add_argument("--draft-model", metavar="PATH", type=checks.draft_model_folder,
                   help="the drafter of --speculative-config's method (draft_model; for "
                   "eagle/eagle3: the head) as its \"model\", e.g. with '{\"method\": "
                   "\"draft_model\", \"num_speculative_tokens\": 3}'; checked against the "
                   "target's tokenizer before the launch, as tuner optimize's --draft-model")
    b.add_argument("--output-dir", type=Path,
                   help="where result.json goes (default: outputs/bench-TIME-METHOD)")
    b.add_argument("--base-url", metavar="URL",
                   help="measure a vLLM server that is already running, e.g. "
                   "http://127.0.0.1:8000 (nothing is launched or stopped; its API key from "
                   "$OPENAI_API_KEY; --model names the tokenizer or the served model)")


def run(args: argparse.Namespace) -> int:
    options = BenchOptions.from_cli_args(args)
    out = options.out_dir
    try:
        result = api.bench(options, say=sayer(args), show_bar=show_bar(args))
    except TrialFailed as e:
        print(f"Measurement failed ({e.kind}): {e}", file=sys.stderr)
        if e.log_tail and not args.quiet:
            print("Last lines of the engine log:\n" + e.log_tail, file=sys.stderr)
        print(f"Engine log: {out / 'engine.log'}", file=sys.stderr)
        return 1
    print(console.bench_table(result))
    print(f"Results: {out / 'result.json'} (per-request records: {out / 'requests.jsonl'})")
    return 0

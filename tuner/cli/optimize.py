"""`tuner optimize`: its arguments (OptimizeOptions) and its run: the search over a space,
the report, and (`--policy`) the load-aware policy after it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner import api, checks
from tuner.cli.arguments import joined, percent, sayer, show_bar
from tuner.cli.measurement import add_engine, add_measure, add_workload
from tuner.cli.policy import add_policy
from tuner.cli.report import print_report
from tuner.outputs import console
from tuner.records.configs import WorkloadSpec
from tuner.records.options import OptimizeOptions

HELP = "search speculative configs with Optuna (resumable)"
# The one home of each option's default, which the parser reads (a workload's name has none).
_O = OptimizeOptions(workload=WorkloadSpec.model_construct())


def _add_search(g: argparse._ArgumentGroup, names: dict[str, str]) -> None:
    """How optimize searches: the space, the budget, the strategy and sampler, what it ranks."""
    g.add_argument("--space", default=_O.space_name,
                   help=f"built-in space ({names['spaces']}) "
                   "or the path of your YAML file")
    g.add_argument("--draft-model", metavar="PATH", type=checks.draft_model_folder,
                   help="the drafter of the space's draft_model method (for eagle/eagle3: the "
                   "head) in place of the space's `model`; checked against the target's "
                   "tokenizer before any launch (default: the space's; the draft space's is "
                   "the embedded default's made drafter)")
    g.add_argument("--n-trials", type=checks.option("n_trials"), default=_O.n_trials,
                   help="total trials, resumes count")
    g.add_argument("--timeout", type=checks.option("timeout"),
                   help="stop launching trials after this many s")
    g.add_argument("--strategy", choices=("auto", "replay", "optuna"), default=_O.strategy,
                   help="replay: predict every n-gram/suffix config from the baseline's tokens "
                   "and launch only calibrations (one; two where the engine splits CUDA graphs) "
                   "and the predicted leaders (--n-trials is "
                   "then the launch budget); optuna: sample configs, one launch each; auto "
                   "(default): replay when every method of the space can be replayed")
    g.add_argument("--confirm-leaders", type=checks.option("confirm_leaders"),
                   default=_O.confirm_leaders,
                   help="replay: predicted leaders to confirm with real launches")
    g.add_argument("--confidence", metavar="PCT", type=checks.option("confidence"),
                   default=percent(_O.confidence),
                   help="confidence of the speedup intervals that end the confirm launches "
                   "and back the recommendation")
    g.add_argument("--margin", metavar="PCT", type=checks.option("margin"),
                   default=percent(_O.margin),
                   help="speedups whose interval lies within this many percent of 1.00x count "
                   "as no difference (either config will do)")
    g.add_argument("--sampler", help=f"one of {names['samplers']} (default: {_O.sampler}); "
                   "naming one asks for the Optuna search (--strategy auto then means optuna)")
    g.add_argument("--sampler-seed", type=checks.option("sampler_seed"), default=_O.seed,
                   help="seed of the sampler and of the replay's choices")
    g.add_argument("--objectives", type=checks.name_list,
                   default=joined(_O.objectives),
                   help=f"comma-separated, from {names['objectives']}")
    g.add_argument("--target-concurrency", type=checks.option("target_concurrency"),
                   help="level the objectives are read at (default: the first --concurrency)")
    g.add_argument("--max-tpot-ms", type=checks.option("max_tpot_ms"),
                   help="SLO: mean TPOT limit (constraint)")
    g.add_argument("--max-ttft-ms", type=checks.option("max_ttft_ms"),
                   help="SLO: p99 TTFT limit (constraint)")
    g.add_argument("--repeats", type=checks.option("repeats"), default=_O.repeats,
                   help="measurements of the leaders")


def _add_study_run(g: argparse._ArgumentGroup) -> None:
    """Where optimize's study lives and runs, its aligned baseline, what follows the search."""
    g.add_argument("--study-name", help="default: WORKLOAD-MODEL; the same name resumes")
    g.add_argument("--storage", help="Optuna RDB URL (default: a journal in the study folder)")
    g.add_argument("--output-dir", type=Path,
                   help="the study folder (default: outputs/STUDY_NAME)")
    g.add_argument("--ray-address", help="Ray cluster address (default: local)")
    g.add_argument("--parallel", type=checks.option("parallel"),
                   help="max trials at once; above 1 runs them as Ray tasks (default: 1, or "
                   "the GPU count with --ray-address)")
    g.add_argument("--gpus-per-trial", type=checks.option("gpus_per_trial"),
                   help="GPUs Ray reserves per trial (default: tensor x pipeline parallel "
                   "size on GPUs, 0 on the CPU)")
    g.add_argument("--logical-gpus", type=checks.option("logical_gpus"),
                   help=argparse.SUPPRESS)  # tests: ray.init(num_gpus=N)
    g.add_argument("--aligned-baseline", metavar="auto|off|ARGS", nargs="?", const="",
                   help="a baseline on the speculative trials' engine path, so each speedup "
                   "splits into the path's cost and speculation's own gain. auto (default): "
                   "read the path from the first speculative trial and measure one where it "
                   "differs from the plain baseline's; off: none; or the vLLM flags yourself, "
                   "e.g. --aligned-baseline '--no-async-scheduling' with "
                   "--aligned-baseline-env")
    g.add_argument("--aligned-baseline-env", action="append", default=[],
                   metavar="NAME=VALUE", help="environment of an explicit aligned baseline, "
                   "e.g. VLLM_USE_V2_MODEL_RUNNER=0 (repeatable)")
    g.add_argument("--no-report", action="store_true",
                   help="skip report.html, plots and recommendation.json (tuner report "
                   "renders them later)")
    g.add_argument("--policy", action="store_true",
                   help="after the search, run the load-aware policy step (see tuner policy)")


def add_arguments(o: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """Fills OptimizeOptions (its `from_cli_args`)."""
    add_workload(o)
    add_engine(o)
    add_measure(o)
    g = o.add_argument_group("search")
    _add_search(g, names)
    _add_study_run(g)
    add_policy(o)


def run(args: argparse.Namespace) -> int:
    options = OptimizeOptions.from_cli_args(args)
    say = sayer(args)
    outcome = api.optimize_and_report(options, say=say, detail=say if args.verbose else None,
                                      show_bar=show_bar(args))
    if outcome.policy is not None:
        print(console.format_policy(outcome.policy))
    if options.report:
        print_report(outcome.paths, outcome.recommendations, outcome.out_dir, args.quiet)
    if outcome.failed:
        # Exit 1, not 2: the options were valid, and whether the engine setup or every config
        # is at fault only the engine's log can tell (the line names it).
        print(f"tuner: error: {outcome.failed}", file=sys.stderr)
        return 1
    return 0

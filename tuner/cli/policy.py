"""`tuner policy`: its arguments (PolicyOptions, also taken by `tuner optimize --policy`)
and its run: the load-aware policy of a study."""

from __future__ import annotations

import argparse

from tuner import api, checks
from tuner.cli.arguments import Renamed, add_storage, add_study_dir, sayer
from tuner.outputs import console
from tuner.records.options import PolicyOptions

HELP = ("load-aware policy: break-even concurrency and the num_speculative_tokens_per_batch_size "
        "schedule, verified")
_P = PolicyOptions()  # the one home of each option's default, which the parser reads


# --concurrency always names the levels to measure (bench, optimize), as in `vllm bench serve`
# (where --max-concurrency is one load level); the flags that meant something else were renamed.
_LADDER_MAX_WHY = ("the top of the policy ladder; in `vllm bench serve` --max-concurrency is "
                   "the load level, here --concurrency")


def add_policy(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load-aware policy")
    g.add_argument("--ladder", type=checks.list_option("ladder", rising=True, blank=True),
                   help="concurrency ladder, e.g. 1,2,4,8,16 (default: powers of two up to "
                   "--ladder-max)")
    g.add_argument("--ladder-max", "--max-concurrency", action=Renamed, old="--max-concurrency",
                   why=_LADDER_MAX_WHY, type=checks.option("ladder_max"), default=_P.ladder_max,
                   help="top of the default ladder (--max-concurrency: its old, deprecated name)")
    g.add_argument("--policy-repeats", type=checks.option("policy_repeats"), default=_P.repeats,
                   help="measurements of each config on the whole ladder")
    g.add_argument("--leaders", type=checks.option("leaders"), default=_P.leaders,
                   help="leading configs (best per method)")
    g.add_argument("--k-values", type=checks.list_option("k_values", unique=False, blank=True),
                   help="K values of the chosen method to measure, e.g. 5,2")
    g.add_argument("--policy-num-prompts", type=checks.option("policy_num_prompts"),
                   help="prompts of the ladder's workload (default: the study's)")
    g.add_argument("--policy-output-len", type=checks.option("policy_output_len"),
                   help="max output tokens on the ladder (default: the study's)")
    g.add_argument("--policy-requests-per-slot", type=checks.option("policy_requests_per_slot"),
                   default=_P.requests_per_slot,
                   help="requests per ladder level = this x concurrency")
    g.add_argument("--side-by-side", action="store_true",
                   help="re-measure baseline and static config interleaved with the policy")


def add_arguments(pl: argparse.ArgumentParser, names: dict[str, str]) -> None:
    add_study_dir(pl)
    add_policy(pl)
    add_storage(pl)


def run(args: argparse.Namespace) -> int:
    doc = api.policy(PolicyOptions.from_cli_args(args), study_dir=args.study_dir,
                     storage_url=args.storage, study_name=args.study_name, say=sayer(args))
    print(console.format_policy(doc))
    return 0

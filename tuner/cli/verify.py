"""`tuner verify`: its arguments (VerifyOptions) and its run: each level's recommended config
and the baseline on prompts the study never sent."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner import api, checks
from tuner.cli.arguments import add_storage, add_study_dir, sayer
from tuner.outputs import console
from tuner.records.options import VerifyOptions

HELP = ("measure each level's recommended config and the baseline on prompts of the workload the "
        "study never sent: does the speedup fall inside the stated interval?")
_V = VerifyOptions(study_dir=Path("."))  # the one home of each option's default


def add_arguments(vf: argparse.ArgumentParser, names: dict[str, str]) -> None:
    """Fills VerifyOptions (its `from_cli_args`)."""
    add_study_dir(vf)
    vf.add_argument("--launches", type=checks.option("launches"), default=_V.launches,
                    help="launches each of the baseline and of every checked config, "
                    "interleaved")
    vf.add_argument("--num-prompts", dest="verify_num_prompts",
                    type=checks.option("verify_num_prompts"),
                    help="fresh measured requests per level (default: as many as the study "
                    "measured there)")
    add_storage(vf)


def run(args: argparse.Namespace) -> int:
    result = api.verify(VerifyOptions.from_cli_args(args), say=sayer(args))
    print(console.verification_table(result))
    if not args.quiet:
        print(f"Verification: {args.study_dir / 'verify.json'} (launches: "
              f"{args.study_dir / 'verify'})", file=sys.stderr)
    return 0

"""`tuner report`: re-render a study's outputs from its storage, and print its
recommendations (as `tuner optimize` does after its search)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tuner import api
from tuner.cli.arguments import add_storage, add_study_dir
from tuner.outputs import console

HELP = "re-render outputs of a study from its storage"


def add_arguments(r: argparse.ArgumentParser, names: dict[str, str]) -> None:
    add_study_dir(r)
    add_storage(r)


def print_report(paths: dict, recs, out: Path, quiet: bool) -> None:
    for rec in recs:
        print(console.format_recommendation(rec))
    if not quiet:
        print(f"Report: {paths.get('report_html', out / 'report.html')}  "
              f"(re-render any time: tuner report {out})", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    paths, recs = api.report(study_dir=args.study_dir, storage_url=args.storage,
                             study_name=args.study_name)
    print_report(paths, recs, args.study_dir, args.quiet)
    return 0

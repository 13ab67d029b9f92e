"""`tuner repair`: move the bad lines of a study's journal into a quarantine file beside it."""

from __future__ import annotations

import argparse

from tuner import api
from tuner.cli.arguments import add_study_dir, sayer

HELP = ("move bad lines of a study's journal into a quarantine file beside it, keeping every good "
        "record")


def add_arguments(rp: argparse.ArgumentParser, names: dict[str, str]) -> None:
    add_study_dir(rp)


def run(args: argparse.Namespace) -> int:
    print(api.repair(study_dir=args.study_dir, say=sayer(args)))
    return 0

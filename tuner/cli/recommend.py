"""`tuner recommend`: the recommended config for one level of a study, as text or JSON."""

from __future__ import annotations

import argparse

from tuner import api, checks
from tuner.cli.arguments import Renamed, add_storage, add_study_dir
from tuner.outputs import console

HELP = "print the recommended config for one level"
_LEVEL_WHY = ("the one level to recommend for; --concurrency is the levels bench and optimize "
              "measure")


def add_arguments(rc: argparse.ArgumentParser, names: dict[str, str]) -> None:
    add_study_dir(rc)
    rc.add_argument("--level", "--concurrency", action=Renamed, old="--concurrency",
                    why=_LEVEL_WHY, type=checks.option("level"),
                    help="the level (default: the study's first; --concurrency: its old, "
                    "deprecated name)")
    rc.add_argument("--max-tpot-ms", type=checks.option("max_tpot_ms"),
                    help="SLO: mean TPOT limit (default: the study's)")
    rc.add_argument("--max-ttft-ms", type=checks.option("max_ttft_ms"),
                    help="SLO: p99 TTFT limit (default: the study's)")
    rc.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    add_storage(rc)


def run(args: argparse.Namespace) -> int:
    rec = api.recommend(study_dir=args.study_dir, storage_url=args.storage,
                        study_name=args.study_name, level=args.level,
                        max_tpot_ms=args.max_tpot_ms, max_ttft_ms=args.max_ttft_ms)
    print(console.recommendation_json(rec) if args.json else console.format_recommendation(rec))
    return 0

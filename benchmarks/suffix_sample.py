"""How far the replay strategy's suffix sample and its climb land from the whole suffix grid's
predicted best (no engine): stored CPU launches, the default space.

Per set of benchmarks/data/cpu-replay, the step cost is fitted as the replay strategy fits it
(the first pass's baseline and its calibration launch, n-gram K=8 window 1-4, the config that
drafts the most per step there), then three predictions are made:

1. the strategy's candidates (every n-gram grid point, 24 seeded suffix points and the start
   points), per seed;
2. the same after `candidates.refine`, the climb over the suffix grid around the leaders;
3. every one of the suffix grid's 1,536 points.

Printed per seed and level: the best predicted suffix throughput of (1) and (2), their share
of (3)'s best, how many configs the climb added and its wall time; then the whole grid's best,
10th, 100th and median, which say how flat the landscape is near its top. These are
predictions only: whether a 0.5% predicted difference is real is beyond what a launch on a
2-core CPU host resolves (two runs of one config differ by more).

    .venv/bin/python benchmarks/suffix_sample.py [SET ...] [--seeds 0,1,2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tuner.records.results import BenchResult
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.search import candidates
from tuner.search import space as spaces
from tuner.tokens import FILE_NAME, TokenCapture

sys.path.insert(0, str(Path(__file__).parent))
from replay_accuracy import CONFIGS  # noqa: E402
from replay_refit import MAX_MODEL_LEN, launches, open_set  # noqa: E402

CALIBRATION = CONFIGS[6]  # ngram k=8 window 1-4: drafts the most per step in every stored set


def fitted_on(root: Path) -> list[MeasuredTrial]:
    out = []
    for name, cfg, folder in launches(root):
        spec = cfg.speculative_config
        if not name.endswith("p1") or (spec and spec != CALIBRATION):
            continue
        result = BenchResult.model_validate_json((folder / "result.json").read_text())
        out.append(MeasuredTrial(len(out), cfg, "calibration" if spec else "baseline",
                                 {lv.concurrency: lv for lv in result.levels},
                                 TokenCapture.load(folder / FILE_NAME)))
    return out


def best_suffix(pred, c: int) -> tuple[float, str]:
    row = next(r for r in pred.leaders(c, 1 << 20) if r.method == "suffix")
    return row.pred_output_throughput, row.label


def check(root: Path, seeds: list[int]) -> None:
    measured = fitted_on(root)
    base = measured[0].capture
    space = spaces.load("default")
    sub = candidates.only_method(space, "suffix")
    grid = [sub.config_from_params(p) for p in candidates.grid_points(sub)]
    t0 = time.monotonic()
    whole = predict(base, grid, measured, max_model_len=MAX_MODEL_LEN, max_num_seqs=256)
    whole_s = time.monotonic() - t0
    levels = sorted(whole.costs)
    top = {c: best_suffix(whole, c)[0] for c in levels}
    for seed in seeds:
        memo: dict = {}

        def run(configs, memo=memo):
            return predict(base, configs, measured, max_model_len=MAX_MODEL_LEN,
                           max_num_seqs=256, memo=memo)

        start = candidates.candidates(space, seed=seed)
        first = run(start)
        t0 = time.monotonic()
        _, climbed, added = candidates.refine(space, start, first, run)
        took = time.monotonic() - t0
        cells = []
        for c in levels:
            s, _ = best_suffix(first, c)
            r, label = best_suffix(climbed, c)
            cells.append(f"c={c} sample {s:6.1f} ({s / top[c]:.4f})  climb {r:6.1f} "
                         f"({r / top[c]:.4f}) {label}")
        print(f"  seed {seed}: climb +{added} configs in {took:4.1f} s")
        for cell in cells:
            print(f"    {cell}")
    print(f"  whole grid: {len(grid)} suffix configs predicted in {whole_s:.0f} s")
    for c in levels:
        ranked = [r.pred_output_throughput for r in whole.leaders(c, 1 << 20)]
        print(f"    c={c}: best {ranked[0]:6.1f} ({best_suffix(whole, c)[1][:60]}); 10th "
              f"{ranked[9]:6.1f}, 100th {ranked[99]:6.1f}, median {ranked[len(ranked) // 2]:6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sets", nargs="*", default=["instructcoder-16p-seed2-bf16",
                                                "sharegpt-16p-seed3-bf16"])
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "cpu-replay")
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    for name in args.sets:
        print(f"== {name}")
        check(open_set(args.data, name), [int(s) for s in args.seeds.split(",")])


if __name__ == "__main__":
    main()

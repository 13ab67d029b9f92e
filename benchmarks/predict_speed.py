"""How long `predict()` takes over a whole space, on stored H200 launches (no engine).

Fits on the H200 set's baseline, aligned baseline and two calibration launches
(benchmarks/data/h200/stepcost-64p, read as benchmarks/stepcost_h200.py reads it), then predicts
every config of the space at every level (64 requests at c=1 and c=8, 128 at c=32) three
times: cold (replays and the numba compile included), then twice with one replay memo, as the
replay strategy re-predicts after each launch; then the climb over the sampled grids around the
leaders (candidates.refine, which the strategy and `tuner predict` run once). Prints the wall
seconds of each.

    .venv/bin/python benchmarks/predict_speed.py [--space ngram]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tuner.replay.predict import predict
from tuner.search import candidates
from tuner.search import space as spaces

sys.path.insert(0, str(Path(__file__).parent))
from stepcost_h200 import GRAPHS, load_launches  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--space", default="ngram")
    ap.add_argument("--data", type=Path,
                    default=Path(__file__).parent / "data" / "h200" / "stepcost-64p")
    args = ap.parse_args()
    fitted = [m for m in load_launches(args.data, graphs=GRAPHS)
              if m.role in ("baseline", "aligned_baseline", "calibration")]
    base = next(m.capture for m in fitted if m.role == "baseline")
    configs = candidates.candidates(spaces.load(args.space))
    memo: dict = {}
    times = []
    for label, kwargs in (("cold", {}), ("memo, 1st", {"memo": memo}), ("memo, 2nd", {"memo": memo})):
        t0 = time.monotonic()
        pred = predict(base, configs, fitted, max_model_len=4096, max_num_seqs=256, **kwargs)
        times.append((label, time.monotonic() - t0))
    print(f"space {args.space!r}: {len(configs)} configs x {len(pred.costs)} levels, "
          f"{len(pred.rows)} rows")
    for label, seconds in times:
        print(f"  {label:10} {seconds:6.2f} s")
    t0 = time.monotonic()
    _, _, added = candidates.refine(
        spaces.load(args.space), configs, pred,
        lambda more: predict(base, more, fitted, max_model_len=4096, max_num_seqs=256,
                             memo=memo), limit=candidates.refine_limit(base))
    print(f"  climb      {time.monotonic() - t0:6.2f} s  ({added} configs added around the "
          "predicted leaders, candidates.refine)")


if __name__ == "__main__":
    main()

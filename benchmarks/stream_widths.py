"""Which passes part a bf16 engine's output from the baseline's: the STREAMS rule
(tuner.replay.streams) against the streams stored launches really emitted, per pass width.

In bf16 a request's greedy output can part from the baseline's under speculation: tokens whose
KV came from a verify pass of several tokens round differently than in one-token passes. The
rule as built counts a pass as drafting when it scored 2 or more tokens (it drafted at all),
and sends a config's request to the calibration launch's stream when the config's passes up to
the parting look more like the calibration's than like the baseline's. Which pass widths round
differently is up to the engine's kernels on the machine at hand, so this script asks, per
stored set (benchmarks/data/cpu-replay) at one level: for every config but the calibration and
every request where the baseline's and the calibration's outputs part, which stream did the
config's engine emit (the baseline's, the calibration's, or a third), and which would the rule
pick if a pass counted as drafting from W tokens scored on, for W = 2..10. Printed: per set
and W, right picks / requests that emitted one of the two recorded streams, and the third
streams apart (no rule over two recordings can name those).

    .venv/bin/python benchmarks/stream_widths.py [--data benchmarks/data/cpu-replay]
        [--concurrency 1] [SET ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from tuner.records.configs import TrialConfig
from tuner.replay import acceptance, streams
from tuner.tokens import FILE_NAME, TokenCapture

sys.path.insert(0, str(Path(__file__).parent))
from replay_accuracy import CONFIGS  # noqa: E402  (the configs those launches measured)
from replay_refit import MAX_MODEL_LEN, open_set, set_names  # noqa: E402

CALIBRATION = 7  # ngram k=8 window 1-4, the calibration of every stored set (folder 07)
WIDTHS = range(streams.DRAFTING_WIDTH, 11)  # from the rule as built


def shape(acc: acceptance.Acceptance, index: int, upto: int, width: int) -> np.ndarray:
    i = acc.request_order[index]
    return streams.pass_shape(acc.request_drafts[i], acc.request_accepted[i], upto, width=width)


def check(root: Path, level: int) -> tuple[dict[int, int], int, int]:
    """Per W the right picks; the requests that emitted a recorded stream; third streams."""
    base = TokenCapture.load(root / "baseline" / FILE_NAME)
    calib = TokenCapture.load(root / f"{CALIBRATION:02d}" / FILE_NAME)
    calib_replay = acceptance.replay(calib, TrialConfig(speculative_config=CONFIGS[CALIBRATION - 1]),
                                     max_model_len=MAX_MODEL_LEN)[level]
    partings = {i: t for (c, i), t in
                streams.Alternate(calib, {level: calib_replay}).partings(base).items()
                if c == level}
    ours = {r.index: r.output for r in base.level(level, warmup=False)}
    theirs = {r.index: r.output for r in calib.level(level, warmup=False)}
    right = dict.fromkeys(WIDTHS, 0)
    judged = third = 0
    for n, spec in enumerate(CONFIGS, start=1):
        if n == CALIBRATION:
            continue
        emitted = {r.index: r.output for r in
                   TokenCapture.load(root / f"{n:02d}" / FILE_NAME).level(level, warmup=False)}
        replayed = acceptance.replay(base, TrialConfig(speculative_config=spec), max_model_len=MAX_MODEL_LEN)[level]
        for index, t in partings.items():
            out = emitted.get(index)
            if out is None:
                continue
            if np.array_equal(out, theirs[index]):
                took_alternate = True
            elif np.array_equal(out, ours[index]):
                took_alternate = False
            else:
                third += 1
                continue
            judged += 1
            for w in WIDTHS:
                right[w] += streams.nearer_alternate(
                    shape(replayed, index, t, w), shape(calib_replay, index, t, w)
                ) == took_alternate
    return right, judged, third


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("sets", nargs="*", help="sets under --data (default: all)")
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data" / "cpu-replay")
    ap.add_argument("--concurrency", type=int, default=1)
    args = ap.parse_args()
    total, judged_all, third_all = dict.fromkeys(WIDTHS, 0), 0, 0
    print(f"right picks of the STREAMS rule at c={args.concurrency}, per pass width W from which "
          f"a pass counts as drafting (the rule as built: W=2)")
    for name in args.sets or set_names(args.data):
        right, judged, third = check(open_set(args.data, name), args.concurrency)
        print(f"  {name:32} " + " ".join(f"W{w}:{right[w]:>2}/{judged}" for w in WIDTHS)
              + f"  (third streams: {third})")
        judged_all += judged
        third_all += third
        for w in WIDTHS:
            total[w] += right[w]
    print(f"  {'all':32} " + " ".join(f"W{w}:{total[w]}/{judged_all}" for w in WIDTHS)
          + f"  (third streams: {third_all})")


if __name__ == "__main__":
    main()

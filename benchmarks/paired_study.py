"""Whether a study measured every config on the same requests, and how close the replay came.

Reads a study folder (`tuner optimize`'s outputs/<study>): every launch's token capture
(trials/N/tokens.npz) and predicted.csv. Prints, per level, how many distinct measured request
sequences the launches sent (1: paired), whether any launch sent one prompt twice (warm-ups
included), and for each launched speculative config its predicted and measured acceptance
length and throughput with the errors, then the median absolute throughput error per level.

    .venv/bin/python benchmarks/paired_study.py outputs/<study>
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import pandas as pd

from tuner.tokens import FILE_NAME, TokenCapture


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("study", type=Path)
    args = ap.parse_args()
    captures = {int(p.parent.name): TokenCapture.load(p)
                for p in sorted((args.study / "trials").glob(f"*/{FILE_NAME}"))}
    if not captures:
        print(f"{args.study}: no trials/N/{FILE_NAME}", file=sys.stderr)
        return 2
    levels = sorted({r.concurrency for cap in captures.values() for r in cap.requests})
    print(f"# {args.study.name}: {len(captures)} launches with token captures")
    for c in levels:
        sequences = {}
        for n, cap in captures.items():
            measured = sorted(cap.level(c, warmup=False), key=lambda r: r.index)
            sequences.setdefault(tuple(tuple(r.prompt.tolist()) for r in measured), []).append(n)
        sizes = ", ".join(f"{len(k)} requests: trials {','.join(map(str, v))}"
                          for k, v in sequences.items())
        print(f"c={c}: {len(sequences)} distinct measured request sequence(s) ({sizes})")
    for n, cap in captures.items():
        sent = [tuple(r.prompt.tolist()) for r in cap.requests]
        if len(sent) != len(set(sent)):
            print(f"trial {n}: {len(sent) - len(set(sent))} prompt(s) sent twice")
    twice = sum(1 for cap in captures.values()
                if len({tuple(r.prompt.tolist()) for r in cap.requests}) != len(cap.requests))
    print(f"launches that sent a prompt twice: {twice} of {len(captures)}")
    path = args.study / "predicted.csv"
    if not path.is_file():
        return 0
    df = pd.read_csv(path)
    done = df[(df["measured_trials"] > 0) & (df["method"] != "none")]
    print("\nlevel  config                                          pred len  meas len  err %  "
          "pred tok/s  meas tok/s  err %")
    for _, r in done.sort_values(["concurrency", "label"]).iterrows():
        print(f"c={int(r['concurrency']):<4} {str(r['label'])[:46]:<46} "
              f"{r['acceptance_length']:8.3f}  {r['meas_acceptance_length']:8.3f}  "
              f"{r['err_acceptance_length_pct']:+5.1f}  {r['pred_output_throughput']:10.1f}  "
              f"{r['meas_output_throughput']:10.1f}  {r['err_output_throughput_pct']:+5.1f}")
    for c, group in done.groupby("concurrency"):
        errs = [abs(x) for x in group["err_output_throughput_pct"] if pd.notna(x)]
        acc = [abs(x) for x in group["err_acceptance_length_pct"] if pd.notna(x)]
        if errs:
            print(f"c={int(c)}: median |throughput error| {statistics.median(errs):.1f}% over "
                  f"{len(errs)} config(s); worst |acceptance error| {max(acc):.2f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

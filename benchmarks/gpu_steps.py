"""What one engine step costs on the GPU, read step by step from the streamed chunks (no GPU
needed here): the launches of `benchmarks/gpu/steps.list` (scripts/gpu_bench.sh with
CONCURRENCY=1,8), stored in benchmarks/data/h200/steps-64p (its SOURCE.md says what they
showed).

At c=1 every streamed chunk is one engine step (the replayed steps equal the chunks, checked
per request below), and the replay of the launch's own tokens says what the step verified: d
draft tokens of the config's K. Per launch this prints the median gap between chunks for steps
that verified no draft (d = 0), a partial draft (0 < d < K) and a full one (d = K: a uniform
decode batch, which keeps vLLM's full CUDA graph), and the share of each. At c=8 the engine's
steps are rebuilt from the chunk times of all requests (chunks closer than CLUSTER times the
level's median gap between a request's chunks came from one step), and the same split is made
by whether every request in the step drafted K (uniform) or not.

    .venv/bin/python benchmarks/gpu_steps.py [--data benchmarks/data/h200/steps-64p]
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
from pathlib import Path

import numpy as np

from tuner.records.configs import TrialConfig
from tuner.records.results import BenchResult
from tuner.replay.acceptance import replay
from tuner.tokens import FILE_NAME, TokenCapture

CLUSTER = 0.25  # of the median chunk gap: chunks of one step reach the client closer
MAX_MODEL_LEN = 8192


def records(folder: Path) -> list[dict]:
    path = folder / "requests.jsonl"
    opener = open if path.exists() else lzma.open
    path = path if path.exists() else folder / "requests.jsonl.xz"
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f]


def drafts_of(folder: Path, spec: dict | None, c: int, recs: list[dict]) -> list[np.ndarray]:
    """Per measured request (index order): the draft length of each decode step."""
    if not spec:
        return [np.zeros(len(r["chunk_gaps_s"]), int) for r in recs]
    cap = TokenCapture.load(folder / FILE_NAME)
    return replay(cap, TrialConfig(speculative_config=spec), max_model_len=MAX_MODEL_LEN,
                  levels=[c])[c].request_drafts


def one_level(folder: Path, spec: dict | None, k: int, c: int) -> str | None:
    recs = sorted((r for r in records(folder) if r["concurrency"] == c and not r["warmup"]
                   and r["error"] is None), key=lambda r: r["index"])
    if not recs:
        return None
    drafts = drafts_of(folder, spec, c, recs)
    aligned = sum(len(d) == len(r["chunk_gaps_s"]) for r, d in zip(recs, drafts, strict=True))
    if c == 1:
        steps = [(int(d_), 1000.0 * g) for r, d in zip(recs, drafts, strict=True)
                 if len(d) == len(r["chunk_gaps_s"])
                 for d_, g in zip(d, r["chunk_gaps_s"], strict=True)]
        kinds = {"d=0": [g for d_, g in steps if d_ == 0],
                 "0<d<K": [g for d_, g in steps if 0 < d_ < k],
                 "d=K": [g for d_, g in steps if k and d_ == k]}
    else:
        kinds = _rebuilt(recs, drafts, k)
    total = sum(len(v) for v in kinds.values())
    cells = "  ".join(f"{name} {statistics.median(v):6.2f} ms ({len(v) / total:4.0%})"
                      if v else f"{name}    -               " for name, v in kinds.items())
    return f"c={c}: {aligned}/{len(recs)} requests one chunk per step  {cells}"


def _rebuilt(recs: list[dict], drafts: list[np.ndarray], k: int) -> dict[str, list[float]]:
    """c > 1: group every request's chunk times into engine steps; per step its gap from the
    step before and whether it was uniform (every request in it drafted K)."""
    events = []  # (time ms, draft of the step that produced the chunk, or None for a prefill)
    for r, d in zip(recs, drafts, strict=True):
        t = 1000.0 * (r["start_s"] + r["ttft_s"])
        events.append((t, None))
        for i, g in enumerate(r["chunk_gaps_s"]):
            t += 1000.0 * g
            events.append((t, int(d[i]) if i < len(d) else -1))
    events.sort(key=lambda e: e[0])
    near = CLUSTER * 1000.0 * statistics.median(g for r in recs for g in r["chunk_gaps_s"])
    steps: list[list[tuple[float, int | None]]] = []
    for e in events:
        if steps and e[0] - steps[-1][-1][0] < near:
            steps[-1].append(e)
        else:
            steps.append([e])
    out: dict[str, list[float]] = ({"with a prefill": [], "non-uniform": [], "uniform": []}
                                   if k else {"with a prefill": [], "decode only": []})
    for prev, step in zip(steps, steps[1:], strict=False):
        gap = statistics.fmean(t for t, _ in step) - statistics.fmean(t for t, _ in prev)
        ds = [d for _, d in step]
        if any(d is None for d in ds):
            out["with a prefill"].append(gap)
        elif not k:
            out["decode only"].append(gap)
        elif all(d == k for d in ds):
            out["uniform"].append(gap)
        else:
            out["non-uniform"].append(gap)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path,
                    default=Path(__file__).parent / "data" / "h200" / "steps-64p")
    args = ap.parse_args()
    for folder in sorted(p for p in args.data.iterdir() if (p / "result.json").exists()):
        raw = json.loads((folder / "result.json").read_text())  # `tuner bench` adds fields
        result = BenchResult.model_validate({k: v for k, v in raw.items()
                                             if k in BenchResult.model_fields})
        spec = result.config.speculative_config
        k = int(spec.get("num_speculative_tokens", 0)) if spec else 0
        tput = "  ".join(f"c={lv.concurrency} {lv.output_throughput:7.1f} tok/s"
                         for lv in result.levels)
        print(f"{folder.name:10} {result.config.label()[:60]:60} {tput}")
        for lv in result.levels:
            line = one_level(folder, spec, k, lv.concurrency)
            if line:
                print(f"    {line}")


if __name__ == "__main__":
    main()

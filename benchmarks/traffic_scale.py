"""How long `tuner predict --traffic` takes, and how much memory, on a large request log.

Builds a traffic file of --requests records (default 10,000) from the data sets bundled with
the package: EditEval (tuner/data/instructcoder) as chat requests (`messages`, the prompt
vLLM's InstructCoder benchmark sends) with the task's reference edit (`output`) as the
answer, and ShareGPT (tuner/data/sharegpt) as completion requests (`prompt`, the first human
turn) with the first reply as the answer; both given as text, so every record is tokenized
(chat template included). The 884 distinct pairs are cycled to reach the count. Then runs

    tuner predict --traffic FILE --space ngram --output-dir TMP

as a subprocess and prints its wall time (time.monotonic around the subprocess) and its peak
resident memory (resource.getrusage(RUSAGE_CHILDREN).ru_maxrss, the largest child's, in
KiB on Linux), with the machine's cores and load average, since the host may be shared.

    .venv/bin/python benchmarks/traffic_scale.py [--requests 10000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import itertools
import json
import lzma
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "tuner" / "data"


def pairs() -> Iterator[dict]:
    """Every bundled request with its reference answer, as a traffic record."""
    with lzma.open(DATA / "instructcoder" / "editeval.jsonl.xz", "rt") as f:
        for line in f:
            r = json.loads(line)
            text = (f"{r['input']}\n\n{r['instruction']} Just output the code, do not include "
                    "any explanation.")
            yield {"messages": [{"role": "user", "content": text}], "completion": r["output"]}
    with lzma.open(DATA / "sharegpt" / "sharegpt_v3_subset.jsonl.xz", "rt") as f:
        for line in f:
            turns = json.loads(line).get("conversations") or []
            if len(turns) >= 2 and turns[0].get("value") and turns[1].get("value"):
                yield {"prompt": str(turns[0]["value"]), "completion": str(turns[1]["value"])}


def build(path: Path, n: int) -> int:
    """Write `n` records to `path` (cycling the bundled pairs); returns the distinct ones."""
    distinct = list(pairs())
    with open(path, "w") as f:
        for record in itertools.islice(itertools.cycle(distinct), n):
            f.write(json.dumps(record) + "\n")
    return len(distinct)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--space", default="ngram")
    ap.add_argument("--keep", type=Path, help="write the traffic file and outputs here")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="traffic-scale-"))
    folder.mkdir(parents=True, exist_ok=True)
    traffic = folder / "traffic.jsonl"
    distinct = build(traffic, args.requests)
    print(f"traffic file: {traffic} ({args.requests} records, {distinct} distinct, "
          f"{traffic.stat().st_size / 2**20:.1f} MiB)")
    tuner = Path(sys.executable).with_name("tuner")
    cmd = [str(tuner), "predict", "--traffic", str(traffic), "--space", args.space,
           "--output-dir", str(folder / "out")]
    load_before = os.getloadavg()[0]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(done.stdout[-3000:])
    if done.returncode:
        print(done.stderr[-3000:])
        sys.exit(done.returncode)
    print(f"command: {' '.join(cmd)}")
    print(f"wall time {wall:.1f} s, peak RSS {peak_kib / 1024:.0f} MiB; "
          f"{os.cpu_count()} cores, 1-minute load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after (other processes share this host)")
    print([line for line in done.stderr.splitlines() if "replayed over" in line][-1:])


if __name__ == "__main__":
    main()

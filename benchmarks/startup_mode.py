"""Which engine mode should the embedded CPU default use: eager or torch.compile?

Launches the real vLLM CPU engine with the embedded SmolLM2 model twice (with and without
--enforce-eager; a fresh compile cache each time, as a new user has), records seconds to
/health, then measures steady-state output throughput and mean TPOT at concurrency 1 on the
same prompts. Prints a table and how it was measured.

    .venv/bin/python benchmarks/startup_mode.py [--num-prompts 6] [--output-len 96]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tuner import api, runner, workloads
from tuner.records import MeasureSettings, TrialConfig, WorkloadSpec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--output-len", type=int, default=96)
    args = ap.parse_args()
    base = api.resolve_engine(model=None)
    wl_spec = WorkloadSpec(name="instructcoder", num_prompts=args.num_prompts,
                           output_len=args.output_len)
    wl = workloads.load(wl_spec, tokenizer=base.model)
    settings = MeasureSettings(concurrencies=(1,))
    rows = []
    for mode, extra in (("eager", base.extra_args),
                        ("compiled", tuple(a for a in base.extra_args if a != "--enforce-eager"))):
        with tempfile.TemporaryDirectory() as cache:
            env = {**base.env, "VLLM_CACHE_ROOT": cache}
            spec = base.model_copy(update={"extra_args": extra, "env": env})
            res = runner.measure(spec, TrialConfig(), wl, settings,
                                 trial_dir=Path(tempfile.mkdtemp()) / mode)
        lv = res.levels[0]
        rows.append((mode, res.engine.start_s, lv.output_throughput, lv.mean_tpot_ms))
    print(f"# {os.cpu_count()} cores; SmolLM2-135M bf16, vLLM CPU build, instructcoder "
          f"{args.num_prompts} prompts x {args.output_len} max tokens, c=1, baseline")
    print(f"{'mode':10} {'start s':>8} {'tok/s':>8} {'TPOT ms':>8}")
    for mode, start, tput, tpot in rows:
        print(f"{mode:10} {start:8.0f} {tput:8.1f} {tpot:8.1f}")


if __name__ == "__main__":
    main()

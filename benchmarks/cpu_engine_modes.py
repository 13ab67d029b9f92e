"""Which engine settings should the embedded CPU default use?

Launches the real vLLM CPU engine with the embedded SmolLM2 model once per variant (a fresh
compile cache each time, as a new user has), records seconds to /health, then measures
steady-state output throughput and mean TPOT at each level of --concurrency (baseline, no
speculation) on the same prompts. Variants run back to back in one process, in the order
given (name one twice, e.g. eager,fp32,eager,fp32, to interleave repeats); the machine is
shared, so read the ratios of repeats measured side by side, not the absolute figures.

    .venv/bin/python benchmarks/cpu_engine_modes.py [--variants eager,compiled,fp32,bind01]
        [--concurrency 1,4]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from tuner.api import engines
from tuner.measure import trial as runner
from tuner.measure import workloads
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import EngineOptions

VARIANTS = {
    # name: (drop these default args, add these args, extra env)
    "eager": ((), (), {}),
    "compiled": (("--enforce-eager",), (), {}),
    "fp32": ((), ("--dtype", "float32"), {}),
    "bind01": ((), (), {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
    "fp32_bind01": ((), ("--dtype", "float32"), {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="eager,compiled")
    ap.add_argument("--num-prompts", type=int, default=6)
    ap.add_argument("--output-len", type=int, default=96)
    ap.add_argument("--concurrency", default="1")
    args = ap.parse_args()
    base = engines.resolve_engine(EngineOptions())
    wl = workloads.load(WorkloadSpec(name="instructcoder", num_prompts=args.num_prompts,
                                     output_len=args.output_len), tokenizer=base.model)
    levels = tuple(int(c) for c in args.concurrency.split(","))
    rows = []
    for name in args.variants.split(","):
        drop, add, env = VARIANTS[name]
        with tempfile.TemporaryDirectory() as cache:
            spec = base.model_copy(update={
                "extra_args": tuple(a for a in base.extra_args if a not in drop) + add,
                "env": {**base.env, "VLLM_CACHE_ROOT": cache, **env}})
            res = runner.measure(spec, TrialConfig(), wl, MeasureSettings(concurrencies=levels),
                                 trial_dir=Path(tempfile.mkdtemp()) / name)
        for lv in res.levels:
            rows.append((name, lv.concurrency, res.engine.start_s, lv.output_throughput,
                         lv.mean_tpot_ms))
            print(f"{name} c={lv.concurrency}: start {res.engine.start_s:.0f} s, "
                  f"{lv.output_throughput:.1f} tok/s, TPOT {lv.mean_tpot_ms:.1f} ms", flush=True)
    print(f"# {os.cpu_count()} cores, load average at end {os.getloadavg()[0]:.1f}; SmolLM2-135M, "
          f"vLLM CPU build, instructcoder {args.num_prompts} prompts x {args.output_len} max "
          f"tokens, c={args.concurrency}, baseline, variants in the order run")
    print(f"{'variant':12} {'c':>3} {'start s':>8} {'tok/s':>8} {'TPOT ms':>8}")
    for name, c, start, tput, tpot in rows:
        print(f"{name:12} {c:3} {start:8.0f} {tput:8.1f} {tpot:8.1f}")


if __name__ == "__main__":
    main()

"""Measurement fidelity (b): our figures against `vllm bench serve` on the same engine.

One real engine (embedded SmolLM2 on the CPU build unless --model is given) serves both
clients. The workload's exact prompt texts (chat template already applied) are exported as a
custom JSONL, so vLLM's benchmark sends identical prompts (`--dataset-name custom
--skip-chat-template`) with the same max tokens, temperature 0 and EOS honoured. Runs are
A-B-A (ours, vLLM's, ours) at each concurrency so drift of the shared machine shows; the
ratio compares vLLM's run with the mean of our two. Prints a table and the command used.

    .venv/bin/python benchmarks/fidelity_vllm.py [--concurrency 1,4] [--num-prompts 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tuner.api import engines
from tuner.measure import load_level, loadgen, metrics, workloads
from tuner.measure.engine import Engine
from tuner.records.configs import TrialConfig, WorkloadSpec
from tuner.records.options import EngineOptions

NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_min": 2,
         "prompt_lookup_max": 5}

VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def ours(eng: Engine, prompts, c: int) -> dict:
    before = metrics.scrape(eng.url, eng.api_key)
    records, wall = loadgen.run_requests(eng.url, prompts, load_level.RequestSettings(
        model=eng.spec.served_model_name, api_key=eng.api_key), concurrency=c)
    after = metrics.scrape(eng.url, eng.api_key)
    lv = metrics.level_metrics(records, concurrency=c, duration_s=wall, warmup_requests=0,
                               counts=metrics.delta(before, after))
    return {"output_throughput": lv.output_throughput, "mean_tpot_ms": lv.mean_tpot_ms,
            "mean_ttft_ms": lv.mean_ttft_ms, "acceptance_rate": None if lv.spec_decode_acceptance_rate is None
            else lv.spec_decode_acceptance_rate / 100,  # both in percent; compared as fractions
            "server_mean_ttft_ms": lv.server_mean_ttft_ms}


def theirs(eng: Engine, dataset: Path, n: int, c: int, out: Path, output_len: int) -> dict:
    argv = ["--backend", "vllm", "--base-url", eng.url, "--endpoint", "/v1/completions",
            "--model", eng.spec.served_model_name, "--tokenizer", eng.spec.tokenizer or
            eng.spec.model, "--dataset-name", "custom", "--dataset-path", str(dataset),
            "--skip-chat-template", "--custom-output-len", str(output_len), "--num-prompts",
            str(n), "--max-concurrency", str(c), "--request-rate", "inf", "--temperature", "0",
            "--save-result", "--result-dir", str(out), "--result-filename", f"vllm_c{c}.json",
            "--disable-shuffle"]
    env = {**os.environ, "OPENAI_API_KEY": eng.api_key}
    r = subprocess.run([sys.executable, "-c", VLLM_BENCH, *argv], env=env, capture_output=True,
                       text=True, timeout=3600)
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed:\n{r.stderr[-3000:]}")
    res = json.loads((out / f"vllm_c{c}.json").read_text())
    return {"output_throughput": res["output_throughput"], "mean_tpot_ms": res["mean_tpot_ms"],
            "mean_ttft_ms": res["mean_ttft_ms"],
            "acceptance_rate": (res.get("spec_decode_acceptance_rate") or 0) / 100
            if res.get("spec_decode_acceptance_rate") is not None else None,
            "argv": argv}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--speculative-config", default=json.dumps(NGRAM))
    args = ap.parse_args()
    engine = engines.resolve_engine(EngineOptions(model=args.model))
    spec = json.loads(args.speculative_config) if args.speculative_config != "none" else None
    wl = workloads.load(WorkloadSpec(name="instructcoder", num_prompts=args.num_prompts,
                                     output_len=args.output_len), tokenizer=engine.tokenizer or engine.model)
    out = Path(tempfile.mkdtemp(prefix="fidelity-"))
    dataset = out / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": p.prompt}) + "\n" for p in wl.prompts))
    rows = []
    with Engine(engine, TrialConfig(speculative_config=spec), log_path=out / "engine.log") as eng:
        # Warm-up with every prompt once: vLLM's prefix cache then holds each prompt for all
        # three runs alike (a first run measured cold had TTFT 2.5 s against 1.5 s warm).
        loadgen.run_requests(eng.url, wl.prompts, load_level.RequestSettings(
            model=eng.spec.served_model_name, api_key=eng.api_key), concurrency=2)
        for c in (int(x) for x in args.concurrency.split(",")):
            a = ours(eng, wl.prompts, c)
            v = theirs(eng, dataset, len(wl.prompts), c, out, args.output_len)
            b = ours(eng, wl.prompts, c)
            rows.append((c, a, v, b))
            print(f"c={c}: ours {a['output_throughput']:.1f}/{b['output_throughput']:.1f} tok/s, "
                  f"vLLM {v['output_throughput']:.1f} tok/s", flush=True)
    print(f"# engine: {Path(engine.model).name}, --speculative-config {args.speculative_config}, "
          f"instructcoder {len(wl.prompts)} prompts, max {args.output_len} tokens, temperature 0, "
          f"EOS honoured; {os.cpu_count()} cores; runs A-B-A (ours, vLLM's, ours)")
    print("# vllm bench serve " + " ".join(rows[0][2]["argv"]))
    print(f"{'c':>3} {'metric':18} {'ours A':>9} {'vLLM':>9} {'ours B':>9} {'ours/vLLM':>10}")
    worst = 0.0
    for c, a, v, b in rows:
        for m in ("output_throughput", "mean_tpot_ms", "mean_ttft_ms"):
            mean = (a[m] + b[m]) / 2
            ratio = mean / v[m]
            if m != "mean_ttft_ms":
                worst = max(worst, abs(ratio - 1))
            print(f"{c:>3} {m:18} {a[m]:9.2f} {v[m]:9.2f} {b[m]:9.2f} {ratio:10.3f}")
        # vLLM's own TTFT histogram over our runs (it starts when the server has the request).
        server = [a["server_mean_ttft_ms"], None, b["server_mean_ttft_ms"]]
        print(f"{c:>3} {'server_ttft_ms':18} " + " ".join(
            f"{x:9.2f}" if x is not None else f"{'-':>9}" for x in server))
        acc = [x["acceptance_rate"] for x in (a, v, b)]
        print(f"{c:>3} {'acceptance_rate':18} " + " ".join(
            f"{x:9.3f}" if x is not None else f"{'-':>9}" for x in acc))
    print(f"worst |ours/vLLM - 1| over throughput and mean TPOT: {worst:.1%} "
          f"({'PASS' if worst <= 0.05 else 'FAIL'} against 5%)")


if __name__ == "__main__":
    main()

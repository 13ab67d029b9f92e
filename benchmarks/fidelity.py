"""Measurement fidelity, part (a): does our client measure TTFT and TPOT right under load?

Starts the fake engine (tuner/testing/fake_engine.py, which writes token i of every request at
arrival + TTFT + i * TPOT against absolute deadlines) through the real Engine class, drives it
with tuner.measure.loadgen.run_requests at each concurrency, aggregates with tuner.measure.metrics.level_metrics
exactly as a trial does, and compares the measured mean TTFT and TPOT with the truth: what the
server really did, request by request, from its own log (GET /fake/served: when each request
arrived, when its first token and its end were written). The script is printed beside; the
two differ by the fake's own lateness (srv lag), which is the server's and not the client's.
The target is every error within 2 %.

    .venv/bin/python benchmarks/fidelity.py                        # lockstep, c = 1..128
    .venv/bin/python benchmarks/fidelity.py --output-spread 0.5    # lengths vary, as in life
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import aiohttp

import tuner
from tuner.measure import load_level, loadgen, metrics
from tuner.measure.client_processes import client_processes
from tuner.measure.engine import Engine
from tuner.records.configs import EngineSpec, Prompt, TrialConfig
from tuner.records.results import LevelMetrics, SpecDecodeCounts
from tuner.testing.fake_script import SCRIPT_ENV

ROOT = Path(tuner.__file__).resolve().parent.parent  # the fake engine child imports this tuner

PROMPT = " ".join(f"word{i}" for i in range(32))


def _fake_stats(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return {k: float(v) for line in text.splitlines() if line.startswith("fake:")
            for k, v in [line.split()]}


def _post(url: str) -> None:
    urllib.request.urlopen(urllib.request.Request(url, method="POST", data=b""), timeout=10)


def _served(url: str) -> list[dict]:
    with urllib.request.urlopen(url + "/fake/served", timeout=30) as r:
        return json.load(r)


def measure_level(eng: Engine, c: int, *, output_tokens: int, spread: float,
                  processes: int | None) -> tuple[LevelMetrics, list, list[dict], dict]:
    """One level as a trial runs it: c short warm-up requests, then max(16, 3c) measured."""
    n = max(16, 3 * c)
    common = dict(concurrency=c, processes=processes)
    settings = load_level.RequestSettings(model=eng.spec.served_model_name, api_key=eng.api_key,
                                       request_timeout_s=60.0, level_timeout_s=600.0)
    warm = [Prompt(prompt=PROMPT, prompt_len=32, output_len=4)] * c
    loadgen.run_requests(eng.url, warm, settings, warmup=True, **common)
    _post(eng.url + "/fake/reset_stats")
    # Equal lengths keep a closed loop's requests in lockstep (c start together, forever);
    # a spread of lengths lets them drift apart as real requests do. TTFT/TPOT stay true.
    rng = random.Random(c)
    lo, hi = round(output_tokens * (1 - spread)), round(output_tokens * (1 + spread))
    # A unique first word per request matches the server's log to the client's records.
    prompts = [Prompt(prompt=f"req{i} {PROMPT}", prompt_len=33, output_len=rng.randint(lo, hi))
               for i in range(n)]
    # start_s on the perf_counter clock, which is the server's CLOCK_MONOTONIC on Linux.
    records, wall_s = loadgen.run_requests(eng.url, prompts, settings, origin_s=0.0, **common)
    level = metrics.level_metrics(records, concurrency=c, duration_s=wall_s,
                                  warmup_requests=c, counts=SpecDecodeCounts())
    return level, records, _served(eng.url), _fake_stats(eng.url)


def _truth(records: list, served: list[dict]) -> dict[str, float]:
    """What really happened, request by request, from the server's log beside the client's.

    On the wire, a request's true TTFT runs from the moment its bytes were written (the
    client stamps that just before the write call) to the moment the server wrote the first
    token; its true TPOT is (server wrote the end - wrote the first token) / (tokens - 1).
    Served TTFT is the server's own view (request seen by its event loop -> first token
    written); the difference, pickup, is time the request waited for the server's loop, which
    a client rightly counts (vLLM's server has it too) and the script does not know about.
    """
    by_word = {s["prompt"].split(" ", 1)[0]: s for s in served}
    true_ttft, served_ttft, pickup, true_tpot, err = [], [], [], [], []
    for rec in records:
        if not rec.ok:
            continue
        s = by_word[f"req{rec.index}"]
        true_ttft.append(s["first_write"] - rec.start_s)
        served_ttft.append(s["first_write"] - s["arrival"])
        pickup.append(s["arrival"] - rec.start_s)
        true_tpot.append((s["eof"] - s["first_write"]) / (s["tokens"] - 1))
        err.append(rec.ttft_s - true_ttft[-1])
    ms = 1000.0
    return {"true_ttft_ms": ms * statistics.fmean(true_ttft),
            "served_ttft_ms": ms * statistics.fmean(served_ttft),
            "pickup_mean_ms": ms * statistics.fmean(pickup),
            "true_tpot_ms": ms * statistics.fmean(true_tpot),
            "req_ttft_err_median_ms": ms * statistics.median(err),
            "req_ttft_err_max_ms": ms * max(err, key=abs)}


def run_scenario(args: argparse.Namespace, *, tokens_per_chunk: int, concurrencies: list[int],
                 log_dir: Path) -> list[dict]:
    """One scripted server (the command line's TTFT, TPOT, output length, loop, spread and
    client processes) at `tokens_per_chunk`, measured at every concurrency."""
    ttft_ms, tpot_ms, output_tokens = args.ttft_ms, args.tpot_ms, args.output_tokens
    server_loop, spread, processes = args.server_loop, args.output_spread, args.client_processes
    script = {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "tokens_per_chunk": tokens_per_chunk,
              "startup_s": 0.0}
    spec = EngineSpec(
        model="fake-model", vllm_cmd=(sys.executable, "-m", "tuner.testing.fake_engine"),
        extra_args=("--fake-loop", server_loop), ready_timeout_s=30.0,
        env={SCRIPT_ENV: json.dumps(script),
             "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT),
                                                          os.environ.get("PYTHONPATH")]))})
    config = TrialConfig(speculative_config={"method": "ngram", "num_speculative_tokens":
                                             tokens_per_chunk - 1} if tokens_per_chunk > 1
                         else None)
    rows = []
    with Engine(spec, config, log_path=log_dir / f"engine-tpc{tokens_per_chunk}.log") as eng:
        with urllib.request.urlopen(eng.url + "/fake/script", timeout=10) as r:
            script_back = json.load(r)  # the script as the server runs it
        for c in concurrencies:
            level, records, served, stats = measure_level(eng, c, output_tokens=output_tokens,
                                                          spread=spread, processes=processes)
            truth = _truth(records, served)
            lag_n = max(stats["fake:emit_lag_seconds_count"], 1.0)
            rows.append({
                "tokens_per_chunk": tokens_per_chunk, "concurrency": c,
                "client_processes": min(c, processes or client_processes(c)),
                "requests": level.num_requests, "failed": level.failed,
                "script_ttft_ms": script_back["ttft_ms"], "script_tpot_ms": script_back["tpot_ms"],
                **truth,
                "mean_ttft_ms": level.mean_ttft_ms, "mean_tpot_ms": level.mean_tpot_ms,
                "ttft_err_pct": 100 * (level.mean_ttft_ms / truth["true_ttft_ms"] - 1),
                "tpot_err_pct": 100 * (level.mean_tpot_ms / truth["true_tpot_ms"] - 1),
                "ttft_vs_script_pct": 100 * (level.mean_ttft_ms / script_back["ttft_ms"] - 1),
                "tpot_vs_script_pct": 100 * (level.mean_tpot_ms / script_back["tpot_ms"] - 1),
                "p99_ttft_ms": level.p99_ttft_ms, "p99_tpot_ms": level.p99_tpot_ms,
                "server_lag_mean_ms": 1000 * stats["fake:emit_lag_seconds_sum"] / lag_n,
                "server_lag_max_ms": 1000 * stats["fake:emit_lag_seconds_max"],
                "max_inflight": int(stats["fake:max_inflight"]),
                "output_throughput": level.output_throughput,
            })
            _print_row(rows[-1])
    return rows


HEADER = (f"{'chunk':>5} {'c':>4} {'reqs':>4} {'fail':>4} | {'script':>6} {'served':>7} "
          f"{'pickup':>6} {'true':>7} {'measured':>8} {'err %':>6} {'req err med/max':>15} | "
          f"{'script':>6} {'true':>7} {'measured':>8} {'err %':>6} | {'srv lag mean/max':>16} "
          f"{'inflight':>8} {'procs':>5}")
SUBHEAD = (f"{'':>21} | {'mean TTFT, ms':^69} | {'mean TPOT, ms':^30} | {'ms':^16} |")


def _print_row(r: dict) -> None:
    print(f"{r['tokens_per_chunk']:>5} {r['concurrency']:>4} {r['requests']:>4} {r['failed']:>4} | "
          f"{r['script_ttft_ms']:>6.1f} {r['served_ttft_ms']:>7.2f} {r['pickup_mean_ms']:>6.2f} "
          f"{r['true_ttft_ms']:>7.2f} {r['mean_ttft_ms']:>8.2f} {r['ttft_err_pct']:>+6.2f} "
          f"{r['req_ttft_err_median_ms']:>7.2f}/{r['req_ttft_err_max_ms']:>7.2f} | "
          f"{r['script_tpot_ms']:>6.1f} {r['true_tpot_ms']:>7.3f} {r['mean_tpot_ms']:>8.3f} "
          f"{r['tpot_err_pct']:>+6.2f} | "
          f"{r['server_lag_mean_ms']:>7.2f}/{r['server_lag_max_ms']:>8.2f} "
          f"{r['max_inflight']:>8} {r['client_processes']:>5}", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64,128")
    p.add_argument("--ttft-ms", type=float, default=80.0)
    p.add_argument("--tpot-ms", type=float, default=12.0)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--tokens-per-chunk", default="1,3",
                   help="one scenario each; 3 mimics speculation (several tokens per chunk)")
    p.add_argument("--server-loop", choices=("asyncio", "uvloop"), default="uvloop")
    p.add_argument("--output-spread", type=float, default=0.0,
                   help="output lengths uniform in N*(1 +- spread); 0: all exactly N (lockstep)")
    p.add_argument("--client-processes", type=int,
                   help="client processes per level (default: the tuner's choice, "
                        "tuner.measure.client_processes)")
    p.add_argument("--target-pct", type=float, default=2.0)
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    concurrencies = [int(x) for x in args.concurrency.split(",")]
    print("Measurement fidelity (a): fake engine with scripted timing, measured by "
          "tuner.measure.loadgen + tuner.measure.metrics")
    lengths = (f"{args.output_tokens} output tokens" if not args.output_spread else
               f"output tokens uniform in {args.output_tokens} +- {args.output_spread:.0%}")
    print(f"  script: TTFT {args.ttft_ms} ms, TPOT {args.tpot_ms} ms, {lengths}, tokens per "
          f"chunk {args.tokens_per_chunk}; requests per level max(16, 3c) after c warm-up "
          f"requests")
    try:
        import uvloop
        client_loop = f"uvloop {uvloop.__version__}"
    except ImportError:
        client_loop = "asyncio"
    print(f"  machine: {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
          f"Linux {platform.release()}, Python {platform.python_version()}; client loop "
          f"{client_loop}, server (aiohttp {aiohttp.__version__}) on {args.server_loop} in its "
          f"own process; load average {os.getloadavg()[0]:.2f} at start")
    print("  script = the fake's scripted TTFT/TPOT. served = the server's own view: request seen by "
          "its event loop -> first token\n  written. pickup = client wrote the request -> server "
          "saw it (time waiting for the server's loop: real\n  server latency, which the script "
          "does not know of). true = on the wire: client wrote the request -> server\n  wrote "
          "the first token (TTFT); (server wrote the end - wrote the first token) / (tokens - 1) "
          "(TPOT); means over\n  the level's requests, from the server's log (GET /fake/served). "
          "measured = tuner.measure.loadgen + tuner.measure.metrics, as a trial.\n"
          f"  err % = measured / true - 1, target |err| <= {args.target_pct} %. req err = "
          "per-request measured - true TTFT (median/largest).\n  srv lag = how late the fake "
          "wrote chunks against its deadlines.\n")
    print(SUBHEAD)
    print(HEADER)
    t0 = time.monotonic()
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="fidelity-") as tmp:
        for tpc in (int(x) for x in args.tokens_per_chunk.split(",")):
            rows += run_scenario(args, tokens_per_chunk=tpc, concurrencies=concurrencies,
                                 log_dir=Path(tmp))
    worst_ttft = max(rows, key=lambda r: abs(r["ttft_err_pct"]))
    worst_tpot = max(rows, key=lambda r: abs(r["tpot_err_pct"]))
    failed = sum(r["failed"] for r in rows)
    print(f"\nmax |TTFT error| {abs(worst_ttft['ttft_err_pct']):.2f} % (c={worst_ttft['concurrency']}, "
          f"chunk {worst_ttft['tokens_per_chunk']}); max |TPOT error| "
          f"{abs(worst_tpot['tpot_err_pct']):.2f} % (c={worst_tpot['concurrency']}, chunk "
          f"{worst_tpot['tokens_per_chunk']}); failed requests {failed}; "
          f"{time.monotonic() - t0:.0f} s; load average {os.getloadavg()[0]:.2f} at the end")
    worst = max(abs(worst_ttft["ttft_err_pct"]), abs(worst_tpot["tpot_err_pct"]))
    ok = worst <= args.target_pct and failed == 0
    over = sorted({(r["tokens_per_chunk"], r["concurrency"]) for r in rows
                   if max(abs(r["ttft_err_pct"]), abs(r["tpot_err_pct"])) > args.target_pct})
    print(("PASS" if ok else "FAIL") + f": max error {worst:.2f} % vs target {args.target_pct} %"
          + (f"; over target at (chunk, c) {over}" if over else ""))
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)},
                                         "cpu_count": os.cpu_count(), "rows": rows}, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

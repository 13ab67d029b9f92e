"""Replay accuracy: predicted acceptance, throughput and TPOT against real launches.

Per workload, on one engine setup (the embedded default unless --model is given): a baseline
launch (its tokens captured), then one launch per config of CONFIGS, every level in each. The
replay predicts every config from the baseline's tokens; the step cost is fitted on the
baseline and ONE calibration config (the one that drafts the most per step, as
`tuner optimize --strategy replay` picks it), so every other config's error is out of sample.
With --passes N every launch runs N times, pass after pass, and errors are taken on each
config's median beside its own spread (half the range of its runs over their median).

Printed per config and level: predicted and measured mean acceptance length, throughput and
mean TPOT with their errors and spread; requests whose output parts from the baseline's
("diverged"), those the replay put on the calibration's stream ("alt", tuner.replay.streams),
the replay's acceptance over the launch's own tokens; the baseline's drift over the run.
Launch folders stay under --out; a rerun reuses finished ones (stored: benchmarks/data/cpu-replay).

    .venv/bin/python benchmarks/replay_accuracy.py [--workloads instructcoder,sharegpt]
        [--num-prompts 8] [--output-len 64] [--concurrency 1,4] [--passes 2] [--seed 0]
        [--engine-args '--dtype float32'] [--out outputs/replay-accuracy]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from tuner import checks, engine_cmdline
from tuner.api import engines
from tuner.measure import trial, workloads
from tuner.outputs import decision_words
from tuner.records.configs import MeasureSettings, TrialConfig, WorkloadSpec
from tuner.records.options import EngineOptions
from tuner.records.results import BenchResult
from tuner.replay import acceptance
from tuner.replay.measured import MeasuredTrial
from tuner.replay.predict import predict
from tuner.search import candidates
from tuner.search import space as spaces
from tuner.tokens import FILE_NAME, TokenCapture


def _ngram(k: int, lo: int, hi: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": lo,
            "prompt_lookup_max": hi}


CONFIGS = [_ngram(1, 1, 2), _ngram(2, 1, 3), _ngram(3, 2, 3), _ngram(4, 2, 4), _ngram(5, 2, 5),
           _ngram(6, 3, 5), _ngram(8, 1, 4), _ngram(8, 4, 6),
           {"method": "suffix", "num_speculative_tokens": 8},
           {"method": "suffix", "num_speculative_tokens": 16,
            "suffix_decoding_max_tree_depth": 32, "suffix_decoding_min_token_prob": 0.05}]


def launch(engine, cfg: TrialConfig, wl, ms: MeasureSettings, folder: Path) -> tuple[BenchResult,
                                                                                       TokenCapture]:
    done = folder / "result.json"
    if not done.exists():
        t0 = time.monotonic()
        result = trial.measure(engine, cfg, wl, ms, trial_dir=folder)
        done.write_text(result.model_dump_json())
        print(f"  measured {cfg.label()} in {time.monotonic() - t0:.0f} s", flush=True)
    result = BenchResult.model_validate_json(done.read_text())
    return result, TokenCapture.load(folder / FILE_NAME)


def divergent(base: TokenCapture, other: TokenCapture) -> tuple[int, int]:
    """(requests whose output differs token for token from the baseline's, requests compared)."""
    ref = {(r.concurrency, r.index): r.output for r in base.requests if not r.warmup}
    pairs = [(ref[(r.concurrency, r.index)], r.output) for r in other.requests
             if not r.warmup and (r.concurrency, r.index) in ref]
    return sum(1 for a, b in pairs if len(a) != len(b) or (a != b).any()), len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workloads", default="instructcoder,sharegpt")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4")
    ap.add_argument("--requests-per-slot", type=int, default=2)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0,
                    help="the workload's shuffle seed: another seed draws other prompts")
    ap.add_argument("--model")
    ap.add_argument("--engine-args", default=None,
                    help="engine flags for every launch, e.g. '--dtype float32' (bf16 rounding "
                         "then no longer parts a speculative engine's output from the baseline's)")
    ap.add_argument("--out", type=Path, default=Path("outputs/replay-accuracy"))
    args = ap.parse_args()
    engine = engines.resolve_engine(EngineOptions(
        model=args.model, extra_args=checks.command_line("--engine-args")(args.engine_args or "")))
    levels = tuple(int(x) for x in args.concurrency.split(","))
    ms = MeasureSettings(concurrencies=levels, requests_per_slot=args.requests_per_slot)
    max_model_len = engine_cmdline.engine_setting(engine, "max_model_len") or 1 << 30
    summary = {}
    for name in args.workloads.split(","):
        print(f"== {name}: {args.num_prompts} prompts x {args.output_len} tokens, "
              f"c={args.concurrency}", flush=True)
        spec = WorkloadSpec(name=name, num_prompts=args.num_prompts, output_len=args.output_len,
                            seed=args.seed)
        wl = workloads.load(spec, tokenizer=engine.tokenizer or engine.model,
                            pool=ms.pool_size(spec.num_prompts), max_model_len=max_model_len,
                            say=print)
        folder = args.out / name
        base_result, base_cap = launch(engine, TrialConfig(), wl, ms, folder / "baseline")
        configs = [TrialConfig(speculative_config=c) for c in CONFIGS]
        first = predict(base_cap, configs, [], max_model_len=max_model_len, max_num_seqs=256)
        top = max(levels)
        calib_row = max((r for r in first.rows if r.concurrency == top and r.method != "none"),
                        key=lambda r: r.drafted_per_step)
        measured = [MeasuredTrial(0, TrialConfig(), "baseline",
                                  {lv.concurrency: lv for lv in base_result.levels}, base_cap)]
        diverged, own = {}, {}
        for p in range(1, args.passes + 1):
            sub = folder if p == 1 else folder / f"pass{p}"
            if p > 1:
                result, cap = launch(engine, TrialConfig(), wl, ms, sub / "baseline")
                measured.append(MeasuredTrial(len(measured), TrialConfig(), "baseline",
                                              {lv.concurrency: lv for lv in result.levels}, cap))
            for i, cfg in enumerate(configs, start=1):
                result, cap = launch(engine, cfg, wl, ms, sub / f"{i:02d}")
                role = "calibration" if cfg.key() == calib_row.key else "search"
                measured.append(MeasuredTrial(len(measured), cfg, role,
                                              {lv.concurrency: lv for lv in result.levels}, cap))
                if p == 1:
                    diverged[cfg.key()] = divergent(base_cap, cap)
                    # The replay over the launch's own tokens: its fidelity to vLLM apart from
                    # how far the speculative outputs drifted from the baseline's (bf16).
                    own[cfg.key()] = {c: a.acceptance_length for c, a in acceptance.replay(
                        cap, cfg, max_model_len=max_model_len).items()}
        spread = _spreads(measured)
        # The baseline again at the end: how far the machine drifted over the run, the
        # spread below which no performance error here means anything.
        end_result, _ = launch(engine, TrialConfig(), wl, ms, folder / "baseline-end")
        drift = {lv.concurrency: round(100 * (lv.output_throughput / base.output_throughput - 1), 1)
                 for lv, base in zip(end_result.levels, base_result.levels, strict=True)}
        print(f"baseline drift over the run (last vs first launch, throughput): "
              f"{', '.join(f'c={c} {d:+.1f}%' for c, d in drift.items())}")
        pred = predict(base_cap, configs, measured, max_model_len=max_model_len, max_num_seqs=256)
        print(f"calibration: {calib_row.label}")
        for c in sorted(pred.costs):
            print("  " + decision_words.step_cost_text(pred.costs[c].fit_record()))
        header = (f"{'config':44} {'c':>2} {'AL pred':>7} {'AL meas':>7} {'err':>6} "
                  f"{'tok/s pred':>10} {'meas':>6} {'err':>6} {'TPOT pred':>9} {'meas':>6} "
                  f"{'err':>6} {'spread':>6} {'diverged':>8} {'alt':>3} {'AL own':>6} {'err':>6}")
        print(header)
        # each row as predicted.csv has it, with the launch's own figures added below
        rows = [r.csv_row() for r in pred.rows if r.method != "none"]
        for r in rows:
            d, n = diverged[r["key"]]
            tag = " (calibration)" if r["calibration"] else ""
            own_al = own[r["key"]].get(r["concurrency"])
            r["own_acceptance_length"] = own_al
            r["spread_pct"] = spread.get((r["key"], r["concurrency"]))
            print(f"{(r['label'] + tag)[:44]:44} {r['concurrency']:>2} "
                  f"{_f(r['acceptance_length'], 7, 3)} {_f(r['meas_acceptance_length'], 7, 3)} "
                  f"{_f(r['err_acceptance_length_pct'], 5, 1)}% "
                  f"{_f(r['pred_output_throughput'], 10, 1)} {_f(r['meas_output_throughput'], 6, 1)} "
                  f"{_f(r['err_output_throughput_pct'], 5, 1)}% "
                  f"{_f(r['pred_mean_tpot_ms'], 9, 1)} {_f(r['meas_mean_tpot_ms'], 6, 1)} "
                  f"{_f(r['err_mean_tpot_pct'], 5, 1)}% {_f(r['spread_pct'], 5, 1)}% "
                  f"{d:>4}/{n:<3} {r['alternate_stream_requests']:>3} "
                  f"{_f(own_al, 6, 3)} {_f(_err(own_al, r['meas_acceptance_length']), 5, 1)}%")
        summary[name] = {**_summary(rows), "baseline_drift_pct": drift}
        print(f"summary {name}: {json.dumps(summary[name])}")
    t0 = time.monotonic()
    sp = spaces.load("default")
    cands = candidates.candidates(sp)
    base_cap = TokenCapture.load(args.out / args.workloads.split(",")[0] / "baseline" / FILE_NAME)
    for cfg in cands:
        acceptance.replay(base_cap, cfg, max_model_len=max_model_len)
    n_ngram = sum(1 for c in cands if c.method == "ngram")
    print(f"replay of space 'default' ({n_ngram} n-gram configs, the whole grid, + "
          f"{len(cands) - n_ngram} suffix configs) over {len(base_cap)} captured requests: "
          f"{time.monotonic() - t0:.1f} s (vLLM already imported)")
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))


def _summary(rows: list[dict]) -> dict:
    """Acceptance within 3% (n-gram) / 10% (suffix) at c=1; out-of-sample performance errors."""
    c1 = [r for r in rows if r["concurrency"] == 1 and r["err_acceptance_length_pct"] is not None]
    ngram = [r for r in c1 if r["method"] == "ngram"]
    suffix = [r for r in c1 if r["method"] == "suffix"]
    own = [abs(e) for r in rows if (e := _err(r["own_acceptance_length"],
                                              r["meas_acceptance_length"])) is not None]
    perf = [abs(r[k]) for r in rows if not r["calibration"]
            for k in ("err_output_throughput_pct", "err_mean_tpot_pct") if r[k] is not None]
    beyond = [abs(r[k]) for r in rows if not r["calibration"]
              for k in ("err_output_throughput_pct", "err_mean_tpot_pct")
              if r[k] is not None and r.get("spread_pct") is not None
              and abs(r[k]) > r["spread_pct"]]
    spreads = [r["spread_pct"] for r in rows if r.get("spread_pct") is not None]
    return {
        "ngram_within_3pct": f"{sum(abs(r['err_acceptance_length_pct']) <= 3 for r in ngram)}"
                             f"/{len(ngram)}",
        "suffix_within_10pct": f"{sum(abs(r['err_acceptance_length_pct']) <= 10 for r in suffix)}"
                               f"/{len(suffix)}",
        "own_tokens_worst_abs_err_pct": round(max(own), 2) if own else None,
        "perf_median_abs_err_pct": round(statistics.median(perf), 2) if perf else None,
        "perf_worst_abs_err_pct": round(max(perf), 2) if perf else None,
        "perf_errors": len(perf),
        "perf_errors_beyond_own_spread": len(beyond),
        "median_spread_pct": round(statistics.median(spreads), 2) if spreads else None,
        "worst_spread_pct": round(max(spreads), 2) if spreads else None}


def _spreads(measured: list[MeasuredTrial]) -> dict[tuple[str, int], float]:
    """Per (config key, level): half the range of its runs' throughput over their median, %."""
    runs: dict[tuple[str, int], list[float]] = {}
    for m in measured:
        for c, lv in m.levels.items():
            runs.setdefault((m.config.key(), c), []).append(lv.output_throughput)
    return {k: 50.0 * (max(v) - min(v)) / statistics.median(v)
            for k, v in runs.items() if len(v) > 1 and statistics.median(v) > 0}


def _err(pred, meas) -> float | None:
    return 100.0 * (pred - meas) / meas if pred is not None and meas else None


def _f(x, width: int, digits: int) -> str:
    return f"{x:{width}.{digits}f}" if isinstance(x, (int, float)) else f"{'-':>{width}}"


if __name__ == "__main__":
    main()

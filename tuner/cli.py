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
    except RecursionError:
        raise ConfigError("--speculative-config is nested too deeply to be a speculative config. "
                          "Example: '{\"method\":\"ngram\",\"num_speculative_tokens\":5}'."
                          ) from None
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ConfigError(f"--speculative-config must be a JSON object, got "
                          f"{type(value).__name__}. Example: '{{\"method\":\"ngram\"}}'.")
    method = value.get("method")
    if not isinstance(method, str) or method not in METHODS or method == "none":
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
    g.add_argument("--acceptance-profile", metavar="RESULT_JSON",
                   help="use vLLM's synthetic rejection sampling with the per-position "
                   "acceptance measured by `tuner bench` on a real model (for dummy weights); "
                   "results are labelled SYNTHETIC")


def _add_measure(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--concurrency", default="1", help="levels, e.g. 1,8,32")
    g.add_argument("--num-requests", type=int, help="measured requests per level")
    g.add_argument("--requests-per-slot", type=int, default=4)


def _add_policy(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load-aware policy")
    g.add_argument("--ladder", help="concurrency ladder, e.g. 1,2,4,8,16 (default: powers of "
                   "two up to --max-concurrency)")
    g.add_argument("--max-concurrency", type=int, default=16)
    g.add_argument("--policy-repeats", type=int, default=2)
    g.add_argument("--leaders", type=int, default=2, help="leading configs (best per method)")
    g.add_argument("--k-values", help="K values of the chosen method to measure, e.g. 5,2")
    g.add_argument("--policy-num-prompts", type=int)
    g.add_argument("--policy-output-len", type=int)
    g.add_argument("--policy-requests-per-slot", type=int, default=4)
    g.add_argument("--side-by-side", action="store_true",
                   help="re-measure baseline and static config interleaved with the policy")


def _policy_kwargs(args: argparse.Namespace) -> dict:
    ladder = parse_concurrency(args.ladder) if args.ladder else None
    if ladder and ladder != tuple(sorted(ladder)):
        raise ConfigError(f"--ladder '{args.ladder}' must rise, e.g. 1,2,4,8.")
    ks = None
    if args.k_values:
        try:
            ks = tuple(int(k) for k in args.k_values.split(","))
        except ValueError:
            raise ConfigError(f"--k-values '{args.k_values}': integers separated by commas, "
                              f"e.g. 5,2.") from None
        if any(k < 1 for k in ks):
            raise ConfigError(f"--k-values '{args.k_values}': every K must be at least 1.")
    for flag in ("max_concurrency", "policy_repeats", "leaders"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be at least 1.")
    return dict(ladder=ladder, max_concurrency=args.max_concurrency,
                repeats=args.policy_repeats, leaders=args.leaders, k_values=ks,
                num_prompts=args.policy_num_prompts, output_len=args.policy_output_len,
                side_by_side=args.side_by_side,
                requests_per_slot=args.policy_requests_per_slot)


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

    o = sub.add_parser("optimize", help="search speculative configs with Optuna (resumable)")
    _add_workload(o)
    _add_engine(o)
    _add_measure(o)
    g = o.add_argument_group("search")
    g.add_argument("--space", default="default", help="built-in space name or YAML path")
    g.add_argument("--n-trials", type=int, default=12, help="total trials, resumes count")
    g.add_argument("--timeout", type=float, help="stop launching trials after this many s")
    g.add_argument("--sampler", default="tpe", help="tpe, nsga2, gp, random or grid")
    g.add_argument("--sampler-seed", type=int, default=0)
    g.add_argument("--objectives", default="output_throughput,mean_tpot_ms")
    g.add_argument("--target-concurrency", type=int,
                   help="level the objectives are read at (default: the first --concurrency)")
    g.add_argument("--max-tpot-ms", type=float, help="SLO: mean TPOT limit (constraint)")
    g.add_argument("--max-ttft-ms", type=float, help="SLO: p99 TTFT limit (constraint)")
    g.add_argument("--repeats", type=int, default=1, help="measurements of the leaders")
    g.add_argument("--study-name")
    g.add_argument("--storage", help="Optuna RDB URL (default: a journal in the study folder)")
    g.add_argument("--output-dir", type=Path)
    g.add_argument("--ray-address", help="Ray cluster address (default: local)")
    g.add_argument("--parallel", type=int, help="max trials at once (default: GPU count)")
    g.add_argument("--gpus-per-trial", type=float)
    g.add_argument("--logical-gpus", type=int, help=argparse.SUPPRESS)  # tests: ray.init(num_gpus=N)
    g.add_argument("--aligned-baseline", metavar="ENGINE_ARGS", nargs="?", const="",
                   help="also measure a baseline on the speculative engine path: vLLM args "
                   "(default none) plus --aligned-baseline-env, e.g. '--no-async-scheduling'")
    g.add_argument("--aligned-baseline-env", action="append", default=[],
                   metavar="NAME=VALUE", help="e.g. VLLM_USE_V2_MODEL_RUNNER=0")
    g.add_argument("--no-report", action="store_true")
    g.add_argument("--policy", action="store_true",
                   help="after the search, run the load-aware policy step (see tuner policy)")
    _add_policy(o)

    r = sub.add_parser("report", help="re-render outputs of a study from its storage")
    r.add_argument("study_dir", type=Path)
    r.add_argument("--storage")
    r.add_argument("--study-name")

    pl = sub.add_parser("policy", help="load-aware policy: break-even concurrency and the "
                        "num_speculative_tokens_per_batch_size schedule, verified")
    pl.add_argument("study_dir", type=Path)
    _add_policy(pl)
    pl.add_argument("--storage")
    pl.add_argument("--study-name")

    rc = sub.add_parser("recommend", help="print the recommended config for one level")
    rc.add_argument("study_dir", type=Path)
    rc.add_argument("--concurrency", type=int)
    rc.add_argument("--max-tpot-ms", type=float)
    rc.add_argument("--max-ttft-ms", type=float)
    rc.add_argument("--json", action="store_true")
    rc.add_argument("--storage")
    rc.add_argument("--study-name")
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

    from tuner.space import load_acceptance_profile, with_acceptance_profile

    config = TrialConfig(speculative_config=parse_spec_config(args.speculative_config))
    if args.acceptance_profile:
        config = with_acceptance_profile(config, load_acceptance_profile(args.acceptance_profile))
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


def cmd_optimize(args: argparse.Namespace) -> int:
    from tuner import api
    from tuner.space import load_acceptance_profile

    workload, settings, engine = _common_records(args)
    if args.n_trials < 1:
        raise ConfigError(f"--n-trials must be at least 1, got {args.n_trials}.")
    if args.repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {args.repeats}.")
    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, got {args.parallel}.")
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    aligned = None
    if args.aligned_baseline is not None or args.aligned_baseline_env:
        import shlex

        from tuner.records import TrialConfig

        flags = shlex.split(args.aligned_baseline or "")
        eng_args: dict = {}
        for i, f in enumerate(flags):
            if not f.startswith("--"):
                continue
            nxt = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
            eng_args[f[2:].replace("-", "_")] = nxt if nxt is not None else True
        env = {}
        for item in args.aligned_baseline_env:
            k, sep, v = item.partition("=")
            if not sep:
                raise ConfigError(f"--aligned-baseline-env '{item}': expected NAME=VALUE.")
            env[k] = v
        aligned = TrialConfig(engine_args=eng_args, engine_env=env)
    target = args.target_concurrency or settings.concurrencies[0]
    name = args.study_name or f"{workload.name}-{Path(engine.model).name}"
    if not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ConfigError(f"--study-name '{name}': use letters, digits, '-', '_' and '.' only.")
    out = args.output_dir or Path("outputs") / name
    say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"Study '{name}' in {out}: space {args.space}, sampler {args.sampler}, "
        f"{args.n_trials} trials, concurrency {','.join(map(str, settings.concurrencies))} "
        f"(objectives at c={target}: {', '.join(objectives)})")
    study = api.optimize(
        workload=workload, engine=engine, space_name=args.space, settings=settings,
        out_dir=out, study_name=name, n_trials=args.n_trials, timeout_s=args.timeout,
        sampler=args.sampler, seed=args.sampler_seed, objectives=objectives,
        target_concurrency=target,
        constraints={"max_tpot_ms": args.max_tpot_ms, "max_ttft_ms": args.max_ttft_ms},
        storage_url=args.storage, ray_address=args.ray_address, parallel=args.parallel,
        repeats=args.repeats, gpus_per_trial=args.gpus_per_trial,
        logical_gpus=args.logical_gpus, say=say,
        acceptance_rates=(load_acceptance_profile(args.acceptance_profile)
                          if args.acceptance_profile else None), aligned_baseline=aligned)
    if args.policy:
        api.policy(study_dir=out, storage_url=args.storage, study_name=name, say=say,
                   **_policy_kwargs(args))
    if not args.no_report:
        _print_report(study, out, args.quiet)
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    from tuner import api, report
    from tuner import study as st

    say = (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))
    kwargs = _policy_kwargs(args)
    doc = api.policy(study_dir=args.study_dir, storage_url=args.storage,
                     study_name=args.study_name, say=say, **kwargs)
    print(report.format_policy(doc))
    study = st.open_existing(args.study_dir, args.storage, args.study_name)
    report.write_outputs(study, args.study_dir)
    return 0


def _print_report(study, out: Path, quiet: bool) -> None:
    from tuner import analysis, report

    paths = report.write_outputs(study, out)
    for rec in analysis.recommendations(study):
        print(report.format_recommendation(rec))
    if not quiet:
        print(f"Report: {paths.get('report_html', out / 'report.html')}  "
              f"(re-render any time: tuner report {out})", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    from tuner import study as st

    study = st.open_existing(args.study_dir, args.storage, args.study_name)
    _print_report(study, args.study_dir, args.quiet)
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    from tuner import analysis, report
    from tuner import study as st

    study = st.open_existing(args.study_dir, args.storage, args.study_name)
    df = analysis.trials_frame(study)
    levels = analysis.levels_of(df)
    c = args.concurrency or (levels[0] if levels else None)
    if c is None or c not in levels:
        raise ConfigError(f"--concurrency {c}: the study measured "
                          f"{', '.join(map(str, levels)) or 'no levels yet'}. Pick one of those.")
    meta = df.attrs.get("tuner", {})
    cons = meta.get("constraints") or {}
    rec = analysis.recommend(
        df, concurrency=c,
        max_tpot_ms=args.max_tpot_ms if args.max_tpot_ms is not None else cons.get("max_tpot_ms"),
        max_ttft_ms=args.max_ttft_ms if args.max_ttft_ms is not None else cons.get("max_ttft_ms"),
        meta=meta)
    if args.json:
        print(rec.model_dump_json(indent=2))
    else:
        print(report.format_recommendation(rec))
    return 0


COMMANDS = {"bench": cmd_bench, "optimize": cmd_optimize, "report": cmd_report,
            "recommend": cmd_recommend, "policy": cmd_policy}


def _sigterm_as_exit(signum: int, _frame: object) -> None:
    # `timeout`, systemd and schedulers stop us with SIGTERM: unwind like Ctrl-C so every
    # engine context manager reaps its process group and finished trials stay stored.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    import signal

    args = build_parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
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

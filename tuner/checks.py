"""Input checks: every check of what a user typed, and every default, in one place.

Promises: a number outside its bound, NaN, an infinity or text that is no number raises
ConfigError with one line naming the option and the bad value, the valid range and why it ends
there, and an example. The CLI converts every option through a converter here as argparse
parses it (`option()`, `list_option()`, ...), so no value reaches a trial unchecked. The checks
that need several options, the machine or the engine (levels against the engine's
--max-num-seqs, the open-file limit, requests per trial, a writable output folder) run when
tuner.api resolves an options record (`bench_options`, `optimize_options`), before anything
is printed or created; so do the defaults: the engine's flags on this machine, the aligned
baseline, the policy ladder. Nothing here starts an engine or probes the machine: tuner.api
hands in what the machine is (a GPU, the embedded model's folder).
"""

from __future__ import annotations

import difflib
import errno
import json
import math
import os
import resource
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner import engine_cmdline
from tuner.errors import ConfigError
from tuner.records.configs import (
    SAMPLING_OFF,
    AlignedBaseline,
    EngineSpec,
    MeasureSettings,
    TrialConfig,
    WorkloadSpec,
)
from tuner.records.options import (
    BenchOptions,
    EngineOptions,
    OptimizeOptions,
    OptimizePlan,
    PolicyOptions,
)
from tuner.speculative import varying_k, vllm_schema, vllm_verdict

DAY_S = 86_400.0
MAX_TOKENS = 1_048_576  # 1M tokens: beyond the context of every served model we know
MAX_LEVEL = 4096
MAX_LEVELS = 32
MAX_REQUESTS_PER_TRIAL = 100_000
MAX_SEED = 2**32 - 1
DATASET_MAX_BYTES = 1 << 30  # the full ShareGPT JSON (~650 MB) must fit
DATASET_MAX_LINE_BYTES = 16 << 20
OPEN_FILES_SPARE = 64  # journal, logs, engine pipes, the tokenizer's files


@dataclass(frozen=True)
class Bound:
    """The valid range of one number, what it counts, and why its maximum is where it is."""

    flag: str
    kind: type  # int or float
    low: float
    high: float
    unit: str
    why: str
    example: str

    def problem(self, value: object) -> str | None:
        """Why `value` (already a number) is refused, or None if it is fine."""
        # An int compares exactly, however large (math.isfinite would overflow on 10**400).
        number = not isinstance(value, bool) and (isinstance(value, int) or (
            self.kind is float and isinstance(value, float) and math.isfinite(value)))
        if not number or not self.low <= value <= self.high:  # type: ignore[operator]
            what = "a whole number" if self.kind is int else "a finite number"
            of = f" of {self.unit}" if self.unit else ""
            return (f"must be {what}{of} between {_num(self.low)} and {_num(self.high)} "
                    f"({self.why})")
        return None


def _b(flag: str, kind: type, low: float, high: float, unit: str, why: str, example: str
       ) -> Bound:
    return Bound(flag, kind, low, high, unit, why, example)


_LEVEL_WHY = ("each slot holds one socket and one request in flight in the driver; beyond "
              f"{MAX_LEVEL} the client is measured, not the engine")
_SEED_WHY = "seeds are 32-bit unsigned in NumPy and vLLM"

# Every numeric option of the CLI, by argparse dest. The reasons are part of the message.
BOUNDS: dict[str, Bound] = {
    # engine
    "ready_timeout": _b("--ready-timeout", float, 1, DAY_S, "seconds",
                        "an engine not up within a day is stuck", "900"),
    "request_timeout": _b("--request-timeout", float, 0.1, DAY_S, "seconds",
                          "a request longer than a day is a hang", "300"),
    "level_timeout": _b("--level-timeout", float, 1, 7 * DAY_S, "seconds",
                        "a level longer than a week is a hang", "3600"),
    # workload
    "num_prompts": _b("--num-prompts", int, 1, 100_000, "prompts",
                      "every prompt is tokenized and held in the driver before the first trial",
                      "16"),
    "seed": _b("--seed", int, 0, MAX_SEED, "", _SEED_WHY, "0"),
    "output_len": _b("--output-len", int, 1, MAX_TOKENS, "tokens",
                     "1M tokens is beyond any served model's context", "200"),
    "max_input_tokens": _b("--max-input-tokens", int, 1, MAX_TOKENS, "tokens",
                           "1M tokens is beyond any served model's context", "1024"),
    "random_input_len": _b("--random-input-len", int, 1, 131_072, "tokens",
                           "random prompts are built token by token in the driver; 128K tokens "
                           "is beyond most models' context", "256"),
    "random_output_len": _b("--random-output-len", int, 1, MAX_TOKENS, "tokens",
                            "1M tokens is beyond any served model's context", "128"),
    "temperature": _b("--temperature", float, 0, 2, "",
                      "the OpenAI API's range; above 2 sampling is close to uniform noise", "0"),
    "top_p": _b("--top-p", float, 0.001, 1, "",
                "a share of the probability mass: 1 is off, and below 0.001 sampling is "
                "greedy in all but name", "0.9"),
    "top_k": _b("--top-k", int, 0, MAX_TOKENS, "tokens",
                "0 is off (vLLM's -1); no vocabulary holds 1M tokens", "50"),
    "min_p": _b("--min-p", float, 0, 1, "",
                "a share of the likeliest token's probability: 0 is off", "0.05"),
    # measurement
    "concurrency": _b("--concurrency", int, 1, MAX_LEVEL, "requests in flight", _LEVEL_WHY,
                      "1,8,32"),
    "num_requests": _b("--num-requests", int, 1, MAX_REQUESTS_PER_TRIAL, "requests",
                       "every request's record is kept in the driver and in requests.jsonl",
                       "64"),
    "requests_per_slot": _b("--requests-per-slot", int, 1, 1000, "requests",
                            "a level sends this many times the concurrency; use --num-requests "
                            "for a fixed count", "4"),
    "sample_prompts": _b("--sample-prompts", int, 0, 100_000, "prompts",
                         "the workload sample's prompts; 0 leaves it out", "128"),
    "num_warmups": _b("--num-warmups", int, 0, 10_000, "requests",
                      "warm-ups are prompts prepared in the driver like measured ones; a few "
                      "per slot warm every code path", "8"),
    "stability": _b("--stability", float, 0, 50, "percent",
                    "0 turns the windows off; windows further apart than half their median do "
                    "not agree on anything", "3"),
    # search
    "n_trials": _b("--n-trials", int, 1, 10_000, "trials",
                   "every trial launches an engine, 30-120 s on a GPU; 10000 is weeks", "12"),
    "timeout": _b("--timeout", float, 1, 30 * DAY_S, "seconds",
                  "a search longer than 30 days is better run in parts: the same command "
                  "resumes", "7200"),
    "sampler_seed": _b("--sampler-seed", int, 0, MAX_SEED, "", _SEED_WHY, "0"),
    "target_concurrency": _b("--target-concurrency", int, 1, MAX_LEVEL, "requests in flight",
                             _LEVEL_WHY, "8"),
    "max_tpot_ms": _b("--max-tpot-ms", float, 0.001, 60_000, "milliseconds",
                      "a token slower than a minute is a hang, not a latency target", "50"),
    "max_ttft_ms": _b("--max-ttft-ms", float, 0.001, DAY_S * 1000, "milliseconds",
                      "a first token later than a day is a hang, not a latency target", "2000"),
    "repeats": _b("--repeats", int, 1, 100, "measurements",
                  "every repeat launches each leading config again", "3"),
    "parallel": _b("--parallel", int, 1, 1024, "trials at once",
                   "one trial per GPU set; more than any one Ray cluster here holds", "4"),
    "gpus_per_trial": _b("--gpus-per-trial", float, 0, 64, "GPUs",
                         "Ray places a trial on one node, and no node has more than 64 GPUs",
                         "1"),
    "logical_gpus": _b("--logical-gpus", int, 0, 1024, "GPUs", "a test setting", "2"),
    # reading a study: recommend's one level, predict's subset of the captured levels
    "level": _b("--level", int, 1, MAX_LEVEL, "requests in flight", _LEVEL_WHY, "8"),
    "levels": _b("--levels", int, 1, MAX_LEVEL, "requests in flight", _LEVEL_WHY, "1,8"),
    # load-aware policy
    "ladder": _b("--ladder", int, 1, MAX_LEVEL, "requests in flight", _LEVEL_WHY,
                 "1,2,4,8,16"),
    # The top of the policy ladder (vLLM's --max-concurrency is one load level; ours was once
    # spelled so too, kept as a deprecated alias by the CLI).
    "ladder_max": _b("--ladder-max", int, 1, MAX_LEVEL, "requests in flight", _LEVEL_WHY,
                     "16"),
    "policy_repeats": _b("--policy-repeats", int, 1, 100, "measurements",
                         "every repeat measures each config on the whole ladder again", "2"),
    "leaders": _b("--leaders", int, 1, 16, "configs",
                  "one leader per speculative method, and vLLM has fewer than 16", "2"),
    "confirm_leaders": _b("--confirm-leaders", int, 1, 16, "configs",
                          "each leader is launched and repeated; 16 exceed any launch budget "
                          "worth predicting for", "2"),
    "confidence": _b("--confidence", float, 50, 99.9, "percent",
                     "below 50% an interval says less than a coin toss; beyond 99.9% the t "
                     "factor of a launch pair exceeds 600 and no launch budget decides", "95"),
    "margin": _b("--margin", float, 0, 50, "percent",
                 "the band around 1.00x that counts as no difference; wider than 50% would "
                 "call a 1.5x speedup the same", "2"),
    "top": _b("--top", int, 1, 100_000, "rows", "more rows than any space has", "10"),
    # tuner verify
    "launches": _b("--launches", int, 1, 100, "launches",
                   "each one launches the baseline and every checked config again", "3"),
    "verify_num_prompts": _b("--num-prompts", int, 1, MAX_REQUESTS_PER_TRIAL, "requests",
                             "every request's record is kept in the driver and in "
                             "requests.jsonl", "16"),
    "k_values": _b("--k-values", int, 1, 64, "draft tokens",
                   "every sequence pays for K drafts each step, and acceptance never reaches "
                   "that far", "5,2"),
    "policy_num_prompts": _b("--policy-num-prompts", int, 1, 100_000, "prompts",
                             "every prompt is tokenized and held in the driver first", "32"),
    "policy_output_len": _b("--policy-output-len", int, 1, MAX_TOKENS, "tokens",
                            "1M tokens is beyond any served model's context", "128"),
    "policy_requests_per_slot": _b("--policy-requests-per-slot", int, 1, 1000, "requests",
                                   "a level sends this many times the concurrency", "4"),
}


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def show(value: object, limit: int = 40, *, quote: bool = False) -> str:
    """A value as the message prints it: plain (or in quotes) when it is a plain token, else
    as a Python literal, cut to `limit`, so the message stays one line whatever was typed."""
    if isinstance(value, str):
        plain = value and value.isprintable() and not any(c.isspace() for c in value)
        text = (f"'{value}'" if quote else value) if plain else repr(value)
        return text if len(text) <= limit else text[:limit - 3] + "..."
    return repr(value)


def unknown_name(where: str, kind: str, name: Any, valid: Sequence[str], origin: str,
                 fix: str) -> ConfigError:
    """One message: the bad name, the close matches, every valid name and where that list
    came from, and what to do."""
    close = difflib.get_close_matches(name, valid, n=3) if isinstance(name, str) else []
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return ConfigError(f"{where}: unknown {kind} {show(name, quote=True)}.{hint} Valid "
                       f"({origin}): {', '.join(valid)}. {fix}")


def _convert(bound: Bound, value: object) -> object:
    """Text from the command line -> a number of the bound's kind (or the text, refused later)."""
    if not isinstance(value, str):
        return value
    try:
        return int(value.strip()) if bound.kind is int else float(value.strip())
    except ValueError:  # also an int of more than 4300 digits
        return value


def check(name: str, value: object) -> int | float:
    """`value` (a number, or the text typed for it) checked against BOUNDS[name]."""
    bound = BOUNDS[name]
    number = _convert(bound, value)
    why = bound.problem(number)
    if why is None and name == "gpus_per_trial" and number > 1 and not float(number).is_integer():
        why = "a fraction only below 1: Ray gives a task part of one GPU or whole GPUs"
    if why is not None:
        raise ConfigError(f"{bound.flag} {show(value)}: {why}. Example: {bound.flag} "
                          f"{bound.example}.")
    return number  # type: ignore[return-value]


def option(name: str) -> Callable[[str], int | float]:
    """An argparse `type=` that converts and checks the option `name` (a ConfigError, not
    argparse's usage text, is what a user sees for a bad value)."""
    def convert(text: str) -> int | float:
        return check(name, text)

    convert.__name__ = BOUNDS[name].kind.__name__
    convert.bound = name  # type: ignore[attr-defined]  # tests find every checked option by it
    return convert


def int_list(text: str, name: str, *, rising: bool = False, unique: bool = True
             ) -> tuple[int, ...]:
    """A comma-separated list of whole numbers, each within BOUNDS[name]: concurrency levels
    (at most MAX_LEVELS of them), a ladder, K values."""
    bound = BOUNDS[name]
    shown, e_g = show(text, quote=True), f"e.g. {bound.flag} {bound.example}"
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:  # also an int of more than 4300 digits
        raise ConfigError(f"{bound.flag} {shown}: expected positive integers separated by "
                          f"commas, {e_g}.") from None
    if not values or any(bound.problem(v) for v in values):
        raise ConfigError(f"{bound.flag} {shown}: every value must be a positive integer "
                          f"from {_num(bound.low)} to {_num(bound.high)} ({bound.why}); {e_g}.")
    if unique:
        values = tuple(dict.fromkeys(values))
    if len(values) > MAX_LEVELS:
        raise ConfigError(f"{bound.flag} {shown}: {len(values)} values, at most {MAX_LEVELS} "
                          f"(every trial measures each of them); {e_g}.")
    if rising and values != tuple(sorted(values)):
        raise ConfigError(f"{bound.flag} {shown} must rise, e.g. {bound.example}.")
    return values


def list_option(name: str, *, rising: bool = False, unique: bool = True, blank: bool = False
                ) -> Callable[[str], tuple[int, ...] | None]:
    """An argparse `type=` for a comma-separated list checked by `int_list`; `blank`: empty
    text means the option's default (None), as when it is not given."""
    def convert(text: str) -> tuple[int, ...] | None:
        if blank and not text.strip():
            return None
        return int_list(text, name, rising=rising, unique=unique)

    convert.__name__ = "list"
    convert.bound = name  # type: ignore[attr-defined]  # tests find every checked option by it
    return convert


def command_line(flag: str) -> Callable[[str], tuple[str, ...]]:
    """An argparse `type=` for an option whose value is a command line of its own
    (`--engine-args`, `--vllm-cmd`): its argv; bad quoting is a user mistake."""
    def convert(text: str) -> tuple[str, ...]:
        return engine_cmdline.split(text, flag=flag)

    convert.__name__ = "command line"
    return convert


def name_value(flag: str, *, example: str = "VLLM_CPU_KVCACHE_SPACE=4", strip: bool = False
               ) -> Callable[[str], tuple[str, str]]:
    """An argparse `type=` for one NAME=VALUE (`--engine-env`; `--metadata` strips spaces)."""
    def convert(text: str) -> tuple[str, str]:
        ((name, value),) = name_value_pairs([text], flag=flag, example=example).items()
        return (name.strip(), value.strip()) if strip else (name, value)

    convert.__name__ = "NAME=VALUE"
    return convert


def name_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of names (`--objectives`); which names are valid is the stage's
    to say (tuner.search.study)."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


# vLLM's --percentile-metrics choices that a closed loop measures (it has no client queue, so
# vLLM's client_queue_time and e2el_including_client_queue do not apply).
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")


def percentile_metrics(text: str) -> tuple[str, ...]:
    """`--percentile-metrics ttft,tpot,itl` as vLLM takes it; an unknown name is refused."""
    chosen = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    bad = [n for n in chosen if n not in PERCENTILE_METRICS]
    if not chosen or bad:
        raise ConfigError(
            f"--percentile-metrics {text!r}: {', '.join(map(repr, bad)) or 'no metric named'}"
            f" is not one the tuner measures. Choose from {','.join(PERCENTILE_METRICS)} "
            f"(a closed loop has no client queue), e.g. --percentile-metrics ttft,tpot,itl.")
    return chosen


def metric_percentiles(text: str) -> tuple[float, ...]:
    """`--metric-percentiles 50,90,99` as vLLM takes it: numbers above 0, at most 100."""
    try:
        values = tuple(dict.fromkeys(float(p) for p in text.split(",") if p.strip()))
    except ValueError:
        values = ()
    if not values or any(not 0 < p <= 100 for p in values):
        raise ConfigError(
            f"--metric-percentiles {text!r}: expected percentiles above 0 and at most 100, "
            f"separated by commas. Use e.g. --metric-percentiles 50,90,99 (vLLM's default "
            f"is 99).")
    return values


# --- checks across options, or against the machine ------------------------------------------
def check_levels_fit_engine(levels: Sequence[int], engine: EngineSpec, *,
                            flag: str = "--concurrency") -> None:
    """Refuse a level above the engine's --max-num-seqs: vLLM would queue the extra requests,
    and the level would measure queueing under a concurrency label. Refused rather than capped,
    because a capped level would be a different experiment under the asked-for name."""
    seqs = engine_cmdline.engine_setting(engine, "max_num_seqs")
    if seqs is not None and levels and max(levels) > seqs:
        raise ConfigError(
            f"{flag} {max(levels)}: above the engine's --max-num-seqs {seqs}, so vLLM would "
            f"run only {seqs} at once and queue the rest: the level would measure queueing, not "
            f"concurrency. Use levels of at most {seqs}, or raise --max-num-seqs in "
            f"--engine-args.")


def check_requests(measure: MeasureSettings, num_prompts: int) -> None:
    """Bound the requests one trial sends (all levels and warm-ups): each is a prompt prepared
    in the driver up front and a record kept in memory and on disk."""
    total = measure.pool_size(num_prompts)
    if total > MAX_REQUESTS_PER_TRIAL:
        levels = ",".join(map(str, measure.concurrencies))
        raise ConfigError(
            f"--concurrency {levels} asks for {total} requests per trial "
            f"(--num-requests or --requests-per-slot x level, plus --num-warmups, by default "
            f"one warm-up per slot); at "
            f"most {MAX_REQUESTS_PER_TRIAL} (each is a prompt prepared in the driver and a "
            f"record kept). Lower --requests-per-slot or set --num-requests.")


def ensure_open_files(max_level: int, *, flag: str = "--concurrency") -> None:
    """The driver opens one socket per slot: raise the soft open-file limit when the hard one
    allows (as vLLM's server does), else refuse before an engine is launched for nothing."""
    need = max_level + OPEN_FILES_SPARE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise ConfigError(f"{flag} {max_level}: needs about {need} open files (a socket per slot), "
                      f"but this process may open only {hard} (`ulimit -Hn`). Raise the limit "
                      f"(ulimit -n {need}) or use levels of at most {hard - OPEN_FILES_SPARE}.")


def output_dir(path: Path, *, flag: str = "--output-dir", keep: bool = True) -> Path:
    """Create the output folder and write a probe file in it, so a file in the way, a read-only
    or full disk is one message before anything runs, not a traceback after a trial.

    `keep=False`: remove again the folders this check created, so a command can check its
    output folder with the rest of its input and create it only once all of it passed."""
    shown = show(str(path), 200, quote=True)
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{flag} {shown}: is a file, not a folder. Pass a folder path (it is "
                          f"created), or move the file away.") from None
    except OSError as e:
        raise ConfigError(f"{flag} {shown}: cannot create the folder ({_why(e)}). Pass a "
                          f"folder you can write, e.g. {flag} outputs/run1.") from None
    probe = path / f".tuner-write-probe-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        fix = ("free space on that disk or pass a folder on another disk"
               if e.errno in (errno.ENOSPC, errno.EDQUOT) else "pass a folder you can write")
        raise ConfigError(f"{flag} {shown}: cannot write in it ({_why(e)}); {fix}, e.g. "
                          f"{flag} /tmp/tuner-run.") from None
    finally:
        try:
            probe.unlink()
        except OSError:
            pass  # never written, or the disk refuses even that: the message above says why
        if not keep:
            for folder in missing:  # deepest first, and only the ones made here
                try:
                    folder.rmdir()
                except OSError:
                    break  # something else wrote there meanwhile: leave it
    return path


def _why(e: OSError) -> str:
    return e.strerror or type(e).__name__


def dataset_path(text: str) -> str:
    """An argparse `type=` for `--dataset-path`: a readable dataset file (dataset_file)."""
    dataset_file(Path(text))
    return text


def dataset_file(path: Path) -> int:
    """A dataset path that is a regular file within DATASET_MAX_BYTES; returns its size.
    A directory, device or fifo (`/dev/zero` reads forever) is refused by name."""
    shown = show(str(path), 200, quote=True)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"Dataset file {shown} does not exist. Check --dataset-path.") from None
    except OSError as e:
        raise ConfigError(f"Dataset file {shown}: cannot be read ({_why(e)}). Check "
                          f"--dataset-path.") from None
    return dataset_stat(path, st)


def dataset_stat(path: Path, st: os.stat_result) -> int:
    """dataset_file's checks on a stat already taken (an open file's fstat, say)."""
    shown = show(str(path), 200, quote=True)
    if not stat.S_ISREG(st.st_mode):
        what = ("a directory" if stat.S_ISDIR(st.st_mode) else "a device" if
                stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "a pipe"
                if stat.S_ISFIFO(st.st_mode) else "not a regular file")
        raise ConfigError(f"--dataset-path {shown}: is {what}, not a dataset file. Pass a "
                          f".jsonl, .json or .parquet file (.jsonl.xz and .json.xz also work).")
    dataset_size(path, st.st_size)
    return st.st_size


def dataset_size(path: Path, size: int) -> None:
    """Refuse a dataset of more than DATASET_MAX_BYTES (its size, or the bytes read so far)."""
    if size > DATASET_MAX_BYTES:
        raise ConfigError(f"--dataset-path {show(str(path), 200, quote=True)}: "
                          f"{size / 2**30:.2f} GiB, above the {DATASET_MAX_BYTES >> 30} GiB "
                          f"limit (it is read into the driver's memory; the full ShareGPT file "
                          f"is 0.65 GiB). Pass a sample of it.")


# --- the engine: the user's model, or the embedded default on this machine ------------------
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": "auto"}
# Measured (benchmarks/cpu_engine_modes.py): eager start-up is far shorter on 2 cores, and the
# compiled graph buys little for a 135M model on the CPU.
CPU_DEFAULT_ARGS = ("--enforce-eager", "--max-model-len", "4096")


def name_value_pairs(items: Sequence[str], *, flag: str,
                     example: str = "VLLM_CPU_KVCACHE_SPACE=4") -> dict[str, str]:
    """`--engine-env NAME=VALUE` (repeated) as a dict."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"{flag} {show(item, quote=True)}: expected NAME=VALUE, e.g. "
                              f"{flag} {example}.")
        out[name] = value
    return out


def engine_spec(options: EngineOptions, *, gpu: bool, embedded_model: str | None
                ) -> EngineSpec:
    """The engine to launch: the user's model (checked), or the embedded default
    (`embedded_model`, its folder, which tuner.api resolves) with the CPU engine's flags and
    environment where there is no GPU (`gpu`, this machine's, also from tuner.api)."""
    default_args: tuple[str, ...] = ()
    model = options.model
    if model is None:
        model_path = str(embedded_model)
        if not gpu:
            default_args = CPU_DEFAULT_ARGS
    else:
        model_path = model
        looks_local = model.startswith((".", "/", "~")) or os.path.exists(model)
        if looks_local and not Path(model).expanduser().exists():
            raise ConfigError(f"Model path '{model}' does not exist. Pass the folder of a Hugging "
                              f"Face checkpoint, a hub id (online machines), or omit --model for "
                              f"the embedded SmolLM2-135M-Instruct.")
        if looks_local:
            model_path = str(Path(model).expanduser().resolve())
    env = {} if gpu else dict(CPU_ENV)
    env.update(options.env)
    return EngineSpec(
        model=model_path, model_name=model or engine_cmdline.EMBEDDED_HUB_ID,
        vllm_cmd=options.vllm_cmd, extra_args=default_args + options.extra_args, env=env,
        device="cuda" if gpu else "cpu", tokenizer=options.tokenizer,
        ready_timeout_s=options.ready_timeout_s, request_timeout_s=options.request_timeout_s,
        level_timeout_s=options.level_timeout_s, fast_start=options.fast_start)


def live_engine_options(options: EngineOptions) -> None:
    """`--base-url`: a server already running, launched by nobody here, so the options that
    say how to launch one would be ignored; refused instead."""
    given = [f for f, v in (("--vllm-cmd", options.vllm_cmd), ("--engine-args",
                                                              options.extra_args),
                            ("--engine-env", options.env)) if v]
    if given:
        raise ConfigError(f"--base-url {options.base_url} with {', '.join(given)}: the tuner "
                          f"starts no engine there, so these would be ignored. Drop them, or "
                          f"drop --base-url to let the tuner launch vLLM with them.")


def check_methods(space: Any, engine: EngineSpec) -> None:
    """Refuse up front the methods whose package or model is missing on this machine, and any
    config of the space vLLM's own SpeculativeConfig would refuse (vllm_accepts)."""
    import importlib.util

    for method, params in space.methods.items():
        if method == "suffix" and not engine.vllm_cmd and \
                importlib.util.find_spec("arctic_inference") is None:
            raise ConfigError(
                f"Search space '{space.name}' includes method 'suffix', which needs the "
                f"arctic-inference package in vLLM's environment. Install it with "
                f"`pip install --no-deps arctic-inference` (scripts/setup.sh does), or use "
                f"--space ngram.")
        draft = params.get("model")
        if isinstance(draft, str) and draft.startswith(("/", ".", "~")) and \
                not Path(draft).expanduser().exists():
            raise ConfigError(
                f"Search space '{space.name}': methods.{method}.model '{draft}' does not exist. "
                f"Point it at the draft/head checkpoint folder (copy search_spaces/draft.yaml "
                f"and edit `model`).")
        if method == "mtp" and engine.device == "cpu":
            raise ConfigError(f"Search space '{space.name}': method 'mtp' needs a target model "
                              f"with MTP layers on the GPU build; drop it for the CPU engine.")
    for where, spec in _space_configs(space):
        vllm_accepts(spec, engine, where=where)


def _space_configs(space: Any, limit: int = 64) -> list[tuple[str, dict]]:
    """Configs that stand for a search space before it runs: every grid point of a small
    space, else each method with every searched value at its lowest and at its highest
    (vLLM's refusals are of values out of range or keys that do not go together), and the
    start points."""
    out: list[tuple[str, dict]] = []
    try:
        points = space.grid(limit=limit)
    except ConfigError:  # too many points, or a float range without `step`
        points = []
        for method in space.speculative_methods():
            for end in ("low", "high"):
                values: dict[str, Any] = {}  # the config's keys, as vLLM takes them
                for key, p in space.methods[method].items():
                    values[key] = _at_end(p, end, at_most=values.get(getattr(p, "at_most", None)),
                                          at_least=values.get(getattr(p, "at_least", None)))
                out.append((f"search space '{space.name}' ({method}, every value at its "
                            f"{end}est)", {"method": method, **values}))
    for params in points:
        spec = space.config_from_params(params).speculative_config
        if spec:
            out.append((f"search space '{space.name}' point {show(params.params())}", spec))
    for point in space.start_points:
        params = space.params_of(point)  # as the study enqueues it: with the fixed values
        spec = space.config_from_params(params).speculative_config if params else None
        if spec:
            out.append((f"search space '{space.name}' start point {show(point.written())}",
                        spec))
    return out


def _at_end(p: Any, end: str, *, at_most: float | None, at_least: float | None) -> Any:
    """A searched value at one end of its range (or its first / last choice), within the
    bounds set by the values before it (`at_most` / `at_least`: the values of the
    parameters its bounds name); a fixed value as it is."""
    kind = getattr(p, "type", None)
    if kind is None:
        return p
    if kind == "choice":
        return list(p.values)[0 if end == "low" else -1]
    low, high = p.low, p.high
    if at_most is not None:
        high = min(high, at_most)
    if at_least is not None:
        low = max(low, at_least)
    value = low if end == "low" else high
    return int(value) if kind == "int" else value


def vllm_accepts(spec: dict, engine: EngineSpec, *, where: str) -> None:
    """Refuse, before any engine starts, a speculative config vLLM's own SpeculativeConfig
    refuses (its field constraints and validators, run here without an engine:
    tuner.speculative.vllm_verdict), or a per-batch-size K schedule for a method whose
    proposer cannot take a changing K (tuner.speculative.varying_k): one message, vLLM's
    reason in its words, what to do."""
    verdict = vllm_verdict(spec, model=engine.model)
    shown = show(json.dumps(spec, separators=(",", ":")), 200, quote=True)
    if verdict.refused:
        raise ConfigError(f"{where} {shown}: {verdict.origin}'s SpeculativeConfig refuses it: "
                          f"\"{verdict.refused.rstrip('.')}\". {_what_to_do(spec)} (vLLM would "
                          f"refuse it only after an engine launch.)")
    schedule = spec.get("num_speculative_tokens_per_batch_size")
    k = spec.get("num_speculative_tokens")
    if isinstance(schedule, list) and isinstance(k, int):
        ks = {min(int(e[2]), k) for e in schedule if isinstance(e, (list, tuple)) and len(e) == 3}
        method = spec.get("method")
        rules = [varying_k(method, runner=r) for r in ("V1", "V2")]
        if ks - {k} and not any(r.accepted for r in rules):
            raise ConfigError(f"{where} {shown}: num_speculative_tokens_per_batch_size changes "
                              f"K with the batch size, and {rules[0].why}. Drop the schedule "
                              f"and give one num_speculative_tokens (`tuner policy` offers "
                              f"bands, a K per range of concurrency, for a router), or use a "
                              f"method whose K may change (ngram, eagle, draft_model).")


def _what_to_do(spec: dict) -> str:
    method = spec.get("method")
    if method in NEEDS_MODEL and not spec.get("model"):
        what = METHODS[method].split(" (")[0]
        example = json.dumps({"method": method, "model": "PATH", "num_speculative_tokens": 3},
                             separators=(",", ":"))
        return (f"Method '{method}' ({what}) needs \"model\", its checkpoint (a folder or hub "
                f"id), and \"num_speculative_tokens\", e.g. '{example}'; or use a method that "
                f"needs no model: ngram, suffix (or --speculative-config none for the baseline).")
    return ("Fix the config as vLLM says (valid methods and keys: --speculative-config "
            "'{\"method\":\"ngram\",\"num_speculative_tokens\":5}' is one), or use "
            "--speculative-config none for the baseline.")


# --- the search ---------------------------------------------------------------------------------
def target_concurrency(target: int | None, levels: Sequence[int]) -> int:
    """The level the objectives are read at: the first level unless given, and one of them."""
    if target is None:
        return levels[0]
    if target not in levels:
        raise ConfigError(f"--target-concurrency {target} is not among --concurrency "
                          f"{','.join(map(str, levels))}; add it there.")
    return target


def study_name(name: str) -> str:
    if not name or not all(ch.isalnum() or ch in "-_." for ch in name):
        raise ConfigError(f"--study-name '{name}': use letters, digits, '-', '_' and '.' only.")
    return name


ALIGNED_MODES = ("auto", "off")


def aligned_baseline(engine_args: str | None, env_items: Sequence[str]) -> AlignedBaseline:
    """`--aligned-baseline` and `--aligned-baseline-env` as what the search tells apart:

    - "auto" (neither option given, or `--aligned-baseline auto`): the search reads the first
      speculative trial's engine path and measures a baseline on it only where it differs;
    - "off": no aligned baseline;
    - a TrialConfig (explicit engine args such as `--aligned-baseline '--no-async-scheduling'`,
      and/or `--aligned-baseline-env NAME=VALUE`): a baseline with exactly those knobs.
    """
    mode = engine_args.strip().lower() if engine_args is not None else None
    if mode in ALIGNED_MODES:
        if env_items:
            why = ("auto finds the path's settings itself" if mode == "auto" else
                   "off measures no aligned baseline")
            raise ConfigError(
                f"--aligned-baseline {mode} with --aligned-baseline-env "
                f"{show(env_items[0], quote=True)}: the environment goes with explicit engine "
                f"args only ({why}). Give the args yourself, e.g. --aligned-baseline "
                f"'--no-async-scheduling' --aligned-baseline-env VLLM_USE_V2_MODEL_RUNNER=0, "
                f"or drop --aligned-baseline-env.")
        return mode  # type: ignore[return-value]
    if engine_args is None and not env_items:
        return "auto"
    flags = engine_cmdline.split(engine_args, flag="--aligned-baseline")
    eng_args: dict[str, Any] = {f.name.replace("-", "_"): True if f.value is None else f.value
                                for f in engine_cmdline.parse_flags(flags)}
    env = name_value_pairs(env_items, flag="--aligned-baseline-env",
                           example="VLLM_USE_V2_MODEL_RUNNER=0")
    if not eng_args and not env:
        raise ConfigError(
            f"--aligned-baseline {show(engine_args or '', quote=True)}: no engine flag and no "
            f"--aligned-baseline-env, so it would be the plain baseline again. Use auto (the "
            f"default: the tuner finds the speculative path's flags), off, or the flags as one "
            f"quoted string, e.g. --aligned-baseline '--no-async-scheduling'.")
    return TrialConfig(engine_args=eng_args, engine_env=env)


def ladder(policy: PolicyOptions) -> tuple[int, ...]:
    """The policy's concurrency ladder: as given, or powers of two up to --ladder-max."""
    if policy.ladder:
        return tuple(policy.ladder)
    top = policy.ladder_max or 16
    out = tuple(2 ** i for i in range(0, int(math.log2(top)) + 1))
    return out if out[-1] == top else out + (top,)


def ladder_fits(policy: PolicyOptions, engine: EngineSpec) -> None:
    """The ladder's top against the engine and the open-file limit, as --concurrency's levels
    are (refused before the search, not after it)."""
    top, flag = ((max(policy.ladder), "--ladder") if policy.ladder else
                 (policy.ladder_max, "--ladder-max"))
    check_levels_fit_engine([top], engine, flag=flag)
    ensure_open_files(top, flag=flag)


def check_sampling(workload: WorkloadSpec, *, speculative: bool = False) -> None:
    """--top-p, --top-k and --min-p act only when sampling (vLLM resets them at temperature 0,
    so a study would differ in name only); vLLM refuses min_p with speculative decoding."""
    flags = {k: f"--{k.replace('_', '-')}" for k in SAMPLING_OFF}
    given = [f"{flags[k]} {v:g}" for k, v in workload.sampling.items() if k in flags]
    if given and not workload.temperature:
        raise ConfigError(f"{', '.join(given)} at --temperature 0: vLLM samples greedily there "
                          f"and ignores {'them' if len(given) > 1 else 'it'}. Set --temperature "
                          f"above 0 (e.g. 0.8), or drop {', '.join(g.split()[0] for g in given)}.")
    if speculative and workload.min_p:
        raise ConfigError(f"--min-p {workload.min_p:g}: vLLM refuses min_p with speculative "
                          f"decoding (every request of a speculative config would fail). Drop "
                          f"--min-p, or use --top-p / --top-k to trim the distribution.")


# --- an options record resolved: the checks across its options and against the engine ------
def measurement(workload: WorkloadSpec, settings: MeasureSettings, engine: EngineSpec) -> None:
    """What bench and optimize measure against the engine and this process's limits."""
    check_sampling(workload)
    check_requests(settings, workload.num_prompts)
    check_levels_fit_engine(settings.concurrencies, engine)
    ensure_open_files(max(settings.concurrencies))


def bench_options(options: BenchOptions, engine: EngineSpec) -> None:
    """Every input of `options` checked on the resolved `engine`. The output folder is
    checked, not kept: tuner.api makes it once the dataset has loaded too."""
    config = options.config
    if engine.base_url and config != TrialConfig():
        given = [f for f, v in (("--speculative-config (or --acceptance-profile)",
                                 config.speculative_config), ("--engine-args", config.engine_args),
                                ("--engine-env", config.engine_env)) if v]
        raise ConfigError(f"--base-url {engine.base_url} with {', '.join(given)}: a running "
                          f"server keeps the config it was started with, and its environment. "
                          f"Drop them to measure it as it is, or drop --base-url to let the "
                          f"tuner launch vLLM with this config.")
    if config.speculative_config:
        vllm_accepts(config.speculative_config, engine, where="--speculative-config")
    measurement(options.workload, options.settings, engine)
    check_sampling(options.workload, speculative=bool(config.speculative_config))
    output_dir(options.out_dir, keep=False)


def optimize_options(options: OptimizeOptions, engine: EngineSpec) -> OptimizePlan:
    """The plan of `options` on the resolved `engine`: every input checked and every default
    that follows from the engine or the levels filled in (the study's name and folder, the
    target level, the aligned baseline). The folder is checked, not kept: tuner.api makes it
    and announces the study once the space, objectives, sampler and dataset have passed."""
    if engine.base_url:
        raise ConfigError(f"--base-url {engine.base_url}: a study launches one engine per "
                          f"config, so it cannot use a server that is already running. Measure "
                          f"that server with `tuner bench --base-url`, or drop --base-url.")
    measurement(options.workload, options.settings, engine)
    check_sampling(options.workload, speculative=True)  # every trial but the baselines
    if options.policy is not None:
        ladder_fits(options.policy, engine)
    target = target_concurrency(options.target_concurrency, options.settings.concurrencies)
    name = study_name(options.study_name or f"{options.workload.name}-{Path(engine.model).name}")
    flags = options.aligned_baseline
    return OptimizePlan(options=options, engine=engine, target_concurrency=target,
                        study_name=name,
                        aligned_baseline=aligned_baseline(flags.engine_args, flags.env),
                        out_dir=output_dir(options.out_dir or Path("outputs") / name,
                                           keep=False))


# --- what to measure: workloads and speculative configs
# The built-in workloads (tuner.measure.workloads builds them; a test keeps the two in step).
WORKLOADS = ("instructcoder", "sharegpt", "spec_bench", "random", "custom")


def workload_name(name: str) -> str:
    if name not in WORKLOADS:
        raise ConfigError(f"Unknown workload '{name}'. Available: {', '.join(WORKLOADS)}. Use "
                          f"--workload custom --dataset-path FILE.jsonl for your own prompts.")
    return name


# --- speculative configs --------------------------------------------------------
# The common methods and what each needs besides the target model, for help texts and
# messages. Which methods and keys a vLLM accepts is its own SpeculativeConfig's answer
# (tuner.speculative.vllm_schema): every check reads that, so a method added to vLLM
# (dflash, deepseek_mtp, ...) is accepted without a change here.
METHODS = {
    "none": "no speculation (the baseline)",
    "ngram": "n-gram prompt lookup on the CPU",
    "ngram_gpu": "n-gram prompt lookup on the GPU",
    "suffix": "suffix-tree decoding (needs the arctic-inference package)",
    "draft_model": "a smaller draft model (needs `model`)",
    "eagle": "EAGLE head (needs `model`)",
    "eagle3": "EAGLE-3 head (needs `model`)",
    "mtp": "the target model's own multi-token-prediction layers",
    "medusa": "Medusa heads (needs `model`)",
    "mlp_speculator": "MLP speculator (needs `model`)",
}
NEEDS_MODEL = {"draft_model", "eagle", "eagle3", "medusa", "mlp_speculator"}


def speculative_config(text: str | None) -> dict | None:
    """`--speculative-config`: JSON object as vLLM takes it, or none/empty for the baseline."""
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
    schema = vllm_schema()
    method = value.get("method")
    if "method" not in value:
        raise ConfigError(f"--speculative-config has no \"method\". Valid ({schema.origin}): "
                          f"{', '.join(schema.methods)}. Add one, e.g. "
                          f"'{{\"method\":\"ngram\",\"num_speculative_tokens\":5}}'; or "
                          f"--speculative-config none for the baseline.")
    if not isinstance(method, str) or method not in schema.methods:
        raise unknown_name("--speculative-config", "method", method, schema.methods,
                           schema.origin, "Fix the method; or use --speculative-config none "
                           "for the baseline.")
    for key in value:
        # vLLM reads `-` as `_` in these keys; an unknown one would fail at engine start-up.
        if key.replace("-", "_") not in schema.keys:
            raise unknown_name("--speculative-config", "key", key, schema.keys, schema.origin,
                               "Fix the key; vLLM would refuse the config at start-up.")
    return value


def acceptance_profile(path: str) -> list[float]:
    """Per-position acceptance rates from a `tuner bench` result.json (its first level that
    has them), or a JSON list of rates."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"--acceptance-profile '{path}': cannot read JSON ({e}). Pass the "
                          f"result.json of a `tuner bench` run with a real model.") from None
    if isinstance(data, list):
        rates = data
    else:
        rates = next((lv.get("spec_decode_per_position_acceptance_rates") for lv in
                      data.get("levels", []) if lv.get("spec_decode_per_position_acceptance_rates")),
                     None)
    if not rates or not all(isinstance(r, (int, float)) and 0 <= r <= 1 for r in rates):
        raise ConfigError(f"--acceptance-profile '{path}': no per-position acceptance rates in "
                          f"[0, 1] found. Use the result.json of `tuner bench` with a "
                          f"speculative config on a real model, or a JSON list like [0.7, 0.5].")
    return [float(r) for r in rates]


# --- a drafter of the user's own (--draft-model) ---------------------------------------------
# A space's `model` that names the embedded default's made drafter (tuner.api resolves it to
# tuner.measure.model.embedded_draft_dir() when the target is the embedded default).
EMBEDDED_DRAFT = "embedded-draft"
# Text whose token ids a drafter's tokenizer must give as the target's does: code, prose,
# digits, spaces and non-ASCII, where tokenizers of different families part.
VOCAB_PROBE = "def area(r):\n    return 3.14159 * r ** 2  # Größe, 面积, naïve café\n"


def draft_model_folder(path: str) -> str:
    """--draft-model: a local folder with a model config (config.json), as vLLM loads a draft
    model or an EAGLE head; its tokenizer is checked against the target's later
    (draft_vocabulary), once the target is resolved."""
    folder = Path(path).expanduser()
    where = f"--draft-model '{path}'"
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"{where} {what}. Pass the folder of a draft model (or EAGLE head) "
                          f"checkpoint, with its config.json; it must share the target "
                          f"model's tokenizer.")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where}: no readable config.json in it ({_config_why(e)}). Pass the "
                          f"folder that holds the checkpoint's config.json and weights.") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: its config.json is not a JSON object. Pass a Hugging Face "
                          f"checkpoint folder.")
    return str(folder.resolve())


def _config_why(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):
        return "missing"
    return e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class Vocabulary:
    """What a model's tokenizer says of itself, for comparing a drafter with its target:
    config.json's vocab_size (None: unknown), the tokenizer's length and VOCAB_PROBE's ids
    (None: the folder has no tokenizer, as EAGLE heads do)."""

    vocab_size: int | None
    tokens: int | None = None
    probe_ids: tuple[int, ...] | None = None


def draft_vocabulary(draft: str, ours: Vocabulary, target: Vocabulary, *, target_name: str
                     ) -> None:
    """Refuse a drafter whose tokens are not the target's: vLLM would run it, and every draft
    would be rejected (or index past the target's vocabulary)."""
    where = f"--draft-model '{draft}'"
    fix = ("Use a drafter of the target's model family, trained with its tokenizer (for "
           "Llama-3.1-8B, Llama-3.2-1B, for example), or pass the target with --model.")
    if ours.probe_ids is not None and target.probe_ids is not None:
        if ours.tokens != target.tokens:
            raise ConfigError(f"{where}: its tokenizer has {ours.tokens} tokens, the target "
                              f"{target_name}'s {target.tokens}: not the same tokenizer. {fix}")
        if ours.probe_ids != target.probe_ids:
            pairs = zip(ours.probe_ids, target.probe_ids, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b),
                      min(len(ours.probe_ids), len(target.probe_ids)))
            raise ConfigError(f"{where}: its tokenizer splits a test text differently from the "
                              f"target {target_name}'s (token {at}: ids "
                              f"{list(ours.probe_ids[at:at + 3])} against "
                              f"{list(target.probe_ids[at:at + 3])}). {fix}")
    if ours.vocab_size is not None and target.vocab_size is not None and \
            ours.vocab_size != target.vocab_size and ours.probe_ids is None:
        # No tokenizer beside it (an EAGLE head): its embedding's size is what can be compared.
        raise ConfigError(f"{where}: its config.json has vocab_size {ours.vocab_size}, the "
                          f"target {target_name}'s {target.vocab_size}: not the target's "
                          f"vocabulary. {fix}")

"""Input checks, numbers: the valid range of every numeric option and the converters that
hold a value to it.

Promises: a number outside its bound, NaN, an infinity or text that is no number raises
ConfigError with one line naming the option and the bad value, the valid range and why it ends
there, and an example. The CLI converts every numeric option through `option()` or
`list_option()` as argparse parses it, so no value reaches a trial unchecked.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError
from tuner.records.configs import (
    LEVEL_TIMEOUT_S,
    READY_TIMEOUT_S,
    REQUEST_TIMEOUT_S,
    MeasureSettings,
    WorkloadSpec,
)
from tuner.records.options import OptimizeOptions, PolicyOptions, TrafficOptions, VerifyOptions

DAY_S = 86_400.0
MAX_TOKENS = 1_048_576  # 1M tokens: beyond the context of every served model we know
MAX_LEVEL = 4096
MAX_LEVELS = 32
MAX_REQUESTS_PER_TRIAL = 100_000
MAX_SEED = 2**32 - 1


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


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

# Where an option's example is its default, it is read from the options record, the default's
# one home (tuner.cli reads the same records for --help).
_W, _M = WorkloadSpec.model_construct(), MeasureSettings()
_O, _P = OptimizeOptions(workload=_W), PolicyOptions()
_T, _V = TrafficOptions(traffic_path=Path(".")), VerifyOptions(study_dir=Path("."))

# Every numeric option of the CLI, by argparse dest. The reasons are part of the message.
_K_WHY = "every sequence pays for K drafts each step, and acceptance never reaches that far"
BOUNDS: dict[str, Bound] = {
    # engine
    "ready_timeout": _b("--ready-timeout", float, 1, DAY_S, "seconds",
                        "an engine not up within a day is stuck", _num(READY_TIMEOUT_S)),
    "request_timeout": _b("--request-timeout", float, 0.1, DAY_S, "seconds",
                          "a request longer than a day is a hang", _num(REQUEST_TIMEOUT_S)),
    "level_timeout": _b("--level-timeout", float, 1, 7 * DAY_S, "seconds",
                        "a level longer than a week is a hang", _num(LEVEL_TIMEOUT_S)),
    # workload
    "num_prompts": _b("--num-prompts", int, 1, 100_000, "prompts",
                      "every prompt is tokenized and held in the driver before the first trial",
                      _num(_W.num_prompts)),
    "seed": _b("--seed", int, 0, MAX_SEED, "", _SEED_WHY, _num(_W.seed)),
    "output_len": _b("--output-len", int, 1, MAX_TOKENS, "tokens",
                     "1M tokens is beyond any served model's context", "200"),
    "max_input_tokens": _b("--max-input-tokens", int, 1, MAX_TOKENS, "tokens",
                           "1M tokens is beyond any served model's context", "1024"),
    "random_input_len": _b("--random-input-len", int, 1, 131_072, "tokens",
                           "random prompts are built token by token in the driver; 128K tokens "
                           "is beyond most models' context", _num(_W.random_input_len)),
    "random_output_len": _b("--random-output-len", int, 1, MAX_TOKENS, "tokens",
                            "1M tokens is beyond any served model's context",
                            _num(_W.random_output_len)),
    "temperature": _b("--temperature", float, 0, 2, "",
                      "the OpenAI API's range; above 2 sampling is close to uniform noise",
                      _num(_W.temperature)),
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
                            "for a fixed count", _num(_M.requests_per_slot)),
    "sample_prompts": _b("--sample-prompts", int, 0, 100_000, "prompts",
                         "the workload sample's prompts; 0 leaves it out", _num(_M.sample_prompts)),
    "num_warmups": _b("--num-warmups", int, 0, 10_000, "requests",
                      "warm-ups are prompts prepared in the driver like measured ones; a few "
                      "per slot warm every code path", "8"),
    "stability": _b("--stability", float, 0, 50, "percent",
                    "0 turns the windows off; windows further apart than half their median do "
                    "not agree on anything", _num(_M.stability_pct)),
    # search
    "n_trials": _b("--n-trials", int, 1, 10_000, "trials",
                   "every trial launches an engine, 30-120 s on a GPU; 10000 is weeks",
                   _num(_O.n_trials)),
    "timeout": _b("--timeout", float, 1, 30 * DAY_S, "seconds",
                  "a search longer than 30 days is better run in parts: the same command "
                  "resumes", "7200"),
    "sampler_seed": _b("--sampler-seed", int, 0, MAX_SEED, "", _SEED_WHY, _num(_O.seed)),
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
                     _num(_P.ladder_max)),
    "policy_repeats": _b("--policy-repeats", int, 1, 100, "measurements",
                         "every repeat measures each config on the whole ladder again",
                         _num(_P.repeats)),
    "leaders": _b("--leaders", int, 1, 16, "configs",
                  "one leader per speculative method, and vLLM has fewer than 16",
                  _num(_P.leaders)),
    "confirm_leaders": _b("--confirm-leaders", int, 1, 16, "configs",
                          "each leader is launched and repeated; 16 exceed any launch budget "
                          "worth predicting for", _num(_O.confirm_leaders)),
    "confidence": _b("--confidence", float, 50, 99.9, "percent",
                     "below 50% an interval says less than a coin toss; beyond 99.9% the t "
                     "factor of a launch pair exceeds 600 and no launch budget decides",
                     _num(100 * _O.confidence)),
    "margin": _b("--margin", float, 0, 50, "percent",
                 "the band around 1.00x that counts as no difference; wider than 50% would "
                 "call a 1.5x speedup the same", _num(100 * _O.margin)),
    "top": _b("--top", int, 1, 100_000, "rows", "more rows than any space has", _num(_T.top)),
    # tuner verify
    "launches": _b("--launches", int, 1, 100, "launches",
                   "each one launches the baseline and every checked config again",
                   _num(_V.launches)),
    "verify_num_prompts": _b("--num-prompts", int, 1, MAX_REQUESTS_PER_TRIAL, "requests",
                             "every request's record is kept in the driver and in "
                             "requests.jsonl", "16"),
    "k_values": _b("--k-values", int, 1, 64, "draft tokens", _K_WHY, "5,2"),
    "policy_num_prompts": _b("--policy-num-prompts", int, 1, 100_000, "prompts",
                             "every prompt is tokenized and held in the driver first", "32"),
    "policy_output_len": _b("--policy-output-len", int, 1, MAX_TOKENS, "tokens",
                            "1M tokens is beyond any served model's context", "128"),
    "policy_requests_per_slot": _b("--policy-requests-per-slot", int, 1, 1000, "requests",
                                   "a level sends this many times the concurrency",
                                   _num(_P.requests_per_slot)),
}


# -- the values a search space may fix or search (tuner.search.space_values) ----------------
def _value_bound(key: str, kind: type, low: float, high: float, why: str) -> Bound:
    return Bound(key, kind, low, high, "", why, "")


_WINDOW_WHY = "an n-gram longer than 64 tokens almost never matches twice"
# Ranges of the values a space may fix or search, where we know the key; any other number in a
# space only has to be finite and at most 2^53 (ANY_NUMBER). The reasons are in the messages.
VALUE_BOUNDS = {
    "num_speculative_tokens": _value_bound(
        "num_speculative_tokens", int, 1, 64, _K_WHY),
    "prompt_lookup_min": _value_bound("prompt_lookup_min", int, 1, 64, _WINDOW_WHY),
    "prompt_lookup_max": _value_bound("prompt_lookup_max", int, 1, 64, _WINDOW_WHY),
    "suffix_decoding_max_tree_depth": _value_bound(
        "suffix_decoding_max_tree_depth", int, 1, 1024, "deeper costs memory for every cached "
        "request, and no draft is that long"),
    "suffix_decoding_min_token_prob": _value_bound(
        "suffix_decoding_min_token_prob", float, 0, 1, "a probability"),
    "draft_tensor_parallel_size": _value_bound(
        "draft_tensor_parallel_size", int, 1, 64, "GPUs of one node"),
    "gpu_memory_utilization": _value_bound(
        "gpu_memory_utilization", float, 0.01, 1, "a fraction of the GPU's memory"),
}
ANY_NUMBER = _value_bound("", float, -2.0**53, 2.0**53, "beyond 2^53 a float no longer holds "
                          "every whole number, so no engine option means it")


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

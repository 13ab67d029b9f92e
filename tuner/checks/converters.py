"""Input checks, text: the argparse `type=` converters of the options that are no number (a
command line, NAME=VALUE, a list of names, vLLM's percentile flags, a workload's name).
A value they cannot read is a ConfigError that names the option and shows an example."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from tuner import engine_cmdline
from tuner.checks.bounds import show
from tuner.errors import ConfigError


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


# The built-in workloads (tuner.measure.workloads builds them; a test keeps the two in step).
WORKLOADS = ("instructcoder", "sharegpt", "spec_bench", "random", "custom")


def workload_name(name: str) -> str:
    if name not in WORKLOADS:
        raise ConfigError(f"Unknown workload '{name}'. Available: {', '.join(WORKLOADS)}. Use "
                          f"--workload custom --dataset-path FILE.jsonl for your own prompts.")
    return name

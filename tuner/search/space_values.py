"""Search stage, the values a search space may fix or search: the range of each key we know
(VALUE_BOUNDS, with the reason for it), and for any other number only what an engine option
can mean (ANY_NUMBER). tuner.search.space checks every value of a space file here, at parse
time.
"""

from __future__ import annotations

from tuner.checks import Bound, show
from tuner.errors import ConfigError

# What a speculative-config key or an engine knob is set to: what YAML, JSON and Optuna's
# categorical choices have in common (null: a key left to vLLM's default).
Value = bool | int | float | str | None
VALUE_TYPES = (bool, int, float, str, type(None))


def _value_bound(key: str, kind: type, low: float, high: float, why: str) -> Bound:
    return Bound(key, kind, low, high, "", why, "")


_WINDOW_WHY = "an n-gram longer than 64 tokens almost never matches twice"
# Ranges of the values a space may fix or search, where we know the key; any other number in a
# space only has to be finite and at most 2^53 (ANY_NUMBER). The reasons are in the messages.
VALUE_BOUNDS = {
    "num_speculative_tokens": _value_bound(
        "num_speculative_tokens", int, 1, 64, "every sequence pays for K drafts each step, and "
        "acceptance never reaches that far"),
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


def check_value(where: str, key: str | None, value: object) -> None:
    """Refuse a number no vLLM option means (NaN, an infinity, 1e300) or a known key out of its
    range, naming the file, the key path and the value; lists and mappings are searched."""
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_value(f"{where}[{i}]", None, item)
        return
    if isinstance(value, dict):
        for k, item in value.items():
            check_value(f"{where}.{k}", k if isinstance(k, str) else None, item)
        return
    bound = VALUE_BOUNDS.get((key or "").replace("-", "_"))  # vLLM reads `-` as `_`
    number = value
    if isinstance(value, str):
        # YAML 1.1 reads `1e300` (no dot) as text, and vLLM's config parsing makes it a number.
        try:
            number = float(value)
        except ValueError:
            if bound is None:
                return  # text: vLLM judges it
        else:
            number = int(number) if number.is_integer() else number
    elif not isinstance(value, (int, float)) or (isinstance(value, bool) and bound is None):
        return  # a flag, or null
    why = (bound or ANY_NUMBER).problem(number)
    if why is not None:
        raise ConfigError(f"{where}: {show(value)}: {why}. Fix the value in the file.")

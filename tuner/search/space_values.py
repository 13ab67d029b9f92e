"""Search stage, the values a search space may fix or search: the range of each key we know
(tuner.checks.bounds VALUE_BOUNDS, with the reason for it), and for any other number only what
an engine option can mean (ANY_NUMBER). tuner.search.space checks every value of a space file
here, at parse time.
"""

from __future__ import annotations

from tuner.checks import show
from tuner.checks.bounds import ANY_NUMBER, VALUE_BOUNDS
from tuner.errors import ConfigError

# What a speculative-config key or an engine knob is set to: what YAML, JSON and Optuna's
# categorical choices have in common (null: a key left to vLLM's default).
Value = bool | int | float | str | None
VALUE_TYPES = (bool, int, float, str, type(None))


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

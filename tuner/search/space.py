"""Search-space stage: YAML files under search_spaces/ -> TrialConfig candidates.

A space names the methods to try and, per method, the `--speculative-config` keys to search
(int / float / choice ranges, or fixed values); `engine:` holds vLLM engine knobs, fixed or
searched. A bound may name an earlier parameter (`at_most: prompt_lookup_max`) so that
constraints such as min <= max hold by construction. Parameters are stored in Optuna under
`method`, `<method>.<key>` and `engine.<key>`, so conditional parameters never collide.
Everything a user can get wrong here raises ConfigError naming the file and key path, at parse
time: methods and keys are checked against the SpeculativeConfig of the vLLM installed in this
Python (read from its source, without importing vLLM), and every searched parameter against the
Optuna distribution it will be sampled from.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from tuner.checks import METHODS, NEEDS_MODEL, show, unknown_name
from tuner.errors import ConfigError
from tuner.records.configs import TrialConfig
from tuner.search.space_values import VALUE_TYPES, Value, check_value
from tuner.speculative.schema import VllmSchema, vllm_schema

PARAM_TYPES = ("int", "float", "choice")


class Param(BaseModel):
    """One searched parameter as the space file declares it (a fixed value is a plain Value)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    type: str
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    values: tuple[Value, ...] | None = None
    at_most: str | None = None
    at_least: str | None = None


@dataclass(frozen=True)
class Point:
    """One candidate of a space: the method and the value of each searched parameter (its
    speculative-config keys, then its engine knobs), in declaration order; the fixed values
    are the space's (SearchSpace.config_from_params fills them in). Hashable, so a grid is a
    set of points. A start point as a file writes it is a Point too, with whatever keys it
    names (SearchSpace.params_of keeps the searched ones). Optuna stores a point as the params
    `method`, `<method>.<key>` and `engine.<key>` (`params`, `from_params`). A dataclass:
    the replay strategy hashes thousands of them per climb."""

    method: str
    values: tuple[tuple[str, Value], ...] = ()
    engine: tuple[tuple[str, Value], ...] = ()

    @classmethod
    def from_params(cls, params: dict[str, Value]) -> Point:
        """The point of an Optuna trial's params (trial.params, or what `params` wrote)."""
        method = str(params.get("method", "none"))
        values = tuple((name.removeprefix(f"{method}."), v) for name, v in params.items()
                       if name.startswith(f"{method}."))
        engine = tuple((name.removeprefix("engine."), v) for name, v in params.items()
                       if name.startswith("engine."))
        return cls(method=method, values=values, engine=engine)

    def params(self) -> dict[str, Value]:
        """The point as Optuna params (study.enqueue_trial)."""
        return {"method": self.method, **{f"{self.method}.{k}": v for k, v in self.values},
                **{f"engine.{k}": v for k, v in self.engine}}

    def value(self, key: str) -> Value:
        """The value of speculative-config key `key`; None where the point has none."""
        return next((v for k, v in self.values if k == key), None)

    def with_value(self, key: str, value: Value) -> Point:
        """This point with speculative-config key `key` set to `value` (in its place)."""
        return replace(self, values=tuple((k, value if k == key else v)
                                          for k, v in self.values))

    def written(self) -> dict[str, Value | dict[str, Value]]:
        """The point as a space file's start point writes it (for messages)."""
        out: dict[str, Value | dict[str, Value]] = {"method": self.method, **dict(self.values)}
        if self.engine:
            out["engine"] = dict(self.engine)
        return out


class SearchSpace(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    description: str = ""
    methods: dict[str, dict[str, Param | Value]]
    engine: dict[str, Param | Value] = {}
    start_points: tuple[Point, ...] = ()
    source: str = ""

    # --- sampling -------------------------------------------------------------------------
    def speculative_methods(self) -> list[str]:
        """The methods a sampler may pick: all but the baseline."""
        return [m for m in self.methods if m != "none"]

    def baseline(self) -> TrialConfig:
        """The no-speculation baseline, with the space's fixed engine values only: it is one
        point measured once per study, so searched engine knobs stay at vLLM's defaults."""
        return build_config("none", {}, {k: p for k, p in self.engine.items()
                                         if not isinstance(p, Param)})

    def suggest(self, trial: Any, *, method_choices: Sequence[str] | None = None) -> TrialConfig:
        """Ask an Optuna trial for one speculative candidate (conditional on the method).

        The baseline is not a choice: the driver enqueues it once (`baseline()`), and a
        sampler free to pick it kept proposing that measured point (TPE did six times in a row
        on a GPU). Optuna refuses a categorical whose choices change within one study, so a
        study stored while "none" was a choice passes those choices (`method_choices`, see
        tuner.search.study.method_choices) and samples as it always did.
        """
        choices = self.speculative_methods()
        if method_choices and set(method_choices) - {"none"} == set(choices):
            choices = list(method_choices)
        method = trial.suggest_categorical("method", choices)
        values: dict[str, Value] = {}
        for key, p in self.methods[method].items():
            values[key] = _suggest(trial, f"{method}.{key}", p, values)
        engine: dict[str, Value] = {}
        for key, p in self.engine.items():
            engine[key] = _suggest(trial, f"engine.{key}", p, engine)
        return build_config(method, values, engine)

    def config_from_params(self, point: Point) -> TrialConfig:
        """Rebuild the TrialConfig of a point (fixed values are filled in)."""
        values = dict(point.values)
        engine = dict(point.engine)
        return build_config(
            point.method,
            {k: (values.get(k) if isinstance(p, Param) else p)
             for k, p in self.methods.get(point.method, {}).items()},
            {k: (engine.get(k) if isinstance(p, Param) else p) for k, p in self.engine.items()})

    def params_of(self, start: Point) -> Point | None:
        """The candidate a start point names (its searched values, in declaration order);
        None where it misses one, or names an unknown method or the baseline (which the
        driver enqueues on its own)."""
        return self._point(start.method, dict(start.values), dict(start.engine))

    def point_of(self, config: TrialConfig) -> Point | None:
        """The candidate `config` is (None where it is not one of this space's)."""
        spec = {k: v for k, v in (config.speculative_config or {}).items() if k != "method"}
        return self._point(config.method, spec, dict(config.engine_args))

    def _point(self, method: str, values: dict[str, Value], engine: dict[str, Value]
               ) -> Point | None:
        if method not in self.methods or method == "none":
            return None
        searched = [k for k, p in self.methods[method].items() if isinstance(p, Param)]
        knobs = [k for k, p in self.engine.items() if isinstance(p, Param)]
        if any(k not in values for k in searched) or any(k not in engine for k in knobs):
            return None
        return Point(method=method, values=tuple((k, values[k]) for k in searched),
                     engine=tuple((k, engine[k]) for k in knobs))

    def grid(self, limit: int = 100_000) -> list[Point]:
        """Every speculative candidate of a finite space (floats need `step`); the baseline is
        enqueued on its own."""
        out: list[Point] = []
        for method in self.speculative_methods():
            keys = self.methods[method]
            for combo in _enumerate(list(keys.items()), method):
                for eng in _enumerate(list(self.engine.items()), "engine"):
                    out.append(Point(method=method, values=combo, engine=eng))
                    if len(out) > limit:
                        raise ConfigError(f"Search space '{self.name}' has more than {limit} "
                                          f"grid points; use a non-grid sampler.")
        return out


def _bounds(p: Param, values: dict[str, Value]) -> tuple[float, float]:
    low, high = p.low, p.high
    if p.at_most is not None:
        high = min(high, values[p.at_most])
    if p.at_least is not None:
        low = max(low, values[p.at_least])
    return low, high


def _suggest(trial: Any, name: str, p: Param | Value, values: dict[str, Value]) -> Value:
    if not isinstance(p, Param):
        return p
    if p.type == "choice":
        return trial.suggest_categorical(name, list(p.values))
    low, high = _bounds(p, values)
    if p.type == "int":
        return trial.suggest_int(name, int(low), int(high), step=int(p.step or 1), log=p.log)
    return trial.suggest_float(name, low, high, step=p.step, log=p.log)


def _enumerate(items: list[tuple[str, Param | Value]], prefix: str
               ) -> Iterator[tuple[tuple[str, Value], ...]]:
    """The searched values of every combination of a block (key, value pairs), expanded in
    declaration order so dependent bounds (at_most/at_least) see their referent."""
    def expand(i: int, chosen: tuple[tuple[str, Value], ...], values: dict[str, Value]
               ) -> Iterator[tuple[tuple[str, Value], ...]]:
        if i == len(items):
            yield chosen
            return
        k, q = items[i]
        if not isinstance(q, Param):
            yield from expand(i + 1, chosen, {**values, k: q})
            return
        for v in _domain(q, values, f"{prefix}.{k}"):
            yield from expand(i + 1, (*chosen, (k, v)), {**values, k: v})
    yield from expand(0, (), {})


def _domain(p: Param, values: dict[str, Value], where: str) -> list[Value]:
    if p.type == "choice":
        return list(p.values)
    low, high = _bounds(p, values)
    if p.type == "int":
        return list(range(int(low), int(high) + 1, int(p.step or 1)))
    if not p.step:
        raise ConfigError(f"{where}: a float range needs `step` for the grid sampler.")
    n = int(math.floor((high - low) / p.step + 1e-9))
    return [round(low + i * p.step, 10) for i in range(n + 1)]


def build_config(method: str, values: dict[str, Value], engine: dict[str, Value]
                 ) -> TrialConfig:
    spec = None if method == "none" else {"method": method, **values}
    return TrialConfig(speculative_config=spec, engine_args=engine)


# --- what vLLM accepts (tuner.speculative reads it) ------------------------------------
def _check_keys(keys: Sequence[Any], where: str, schema: VllmSchema, *,
                method: str | None) -> None:
    """Refuse a `--speculative-config` key vLLM does not have, before any trial launches an
    engine that would refuse it. vLLM reads `-` as `_` in these keys."""
    valid = [k for k in schema.keys if method is None or k != "method"]
    for key in keys:
        if not isinstance(key, str):
            continue  # the parameter parser names it
        if key == "method" and method is not None:
            raise ConfigError(f"{where}.method: the method is the name of this block "
                              f"({method}), not one of its keys. Remove the key, or move the "
                              f"parameters under `methods: {{NAME: ...}}` for another method.")
        if key.replace("-", "_") not in schema.keys:
            raise unknown_name(f"{where}.{key}", "speculative-config key", key, valid,
                                schema.origin, "Fix the key in the file; vLLM would refuse "
                                "the config at start-up, in every trial.")


# --- loading -------------------------------------------------------------------------------
def builtin_dir() -> Path:
    """The built-in spaces: the checkout's root folder search_spaces/, which a wheel installs
    as tuner/search_spaces (pyproject.toml maps it into the package)."""
    return spaces_dir(Path(str(resources.files("tuner"))))


def spaces_dir(package: Path) -> Path:
    """Where the built-in spaces are for the `tuner` package folder `package`: inside it when
    installed from a wheel, else beside it, in the checkout it runs from (an editable install,
    or `python3 -m tuner` with the checkout on sys.path)."""
    for d in (package / "search_spaces", package.parent / "search_spaces"):
        if d.is_dir():
            return d
    return package / "search_spaces"


def available() -> list[str]:
    return sorted(p.stem for p in builtin_dir().glob("*.yaml"))


def load(name_or_path: str) -> SearchSpace:
    """A built-in space by name, or a YAML file by path."""
    path = Path(name_or_path)
    if not (path.suffix in (".yaml", ".yml") or path.exists()):
        path = builtin_dir() / f"{name_or_path}.yaml"
        if not builtin_dir().is_dir():
            raise ConfigError(
                f"The built-in search spaces are missing (no folder {builtin_dir()}, nor "
                f"search_spaces/ beside the tuner package): reinstall spec-tuner, or pass the "
                f"path of a YAML file.")
        if not path.exists():
            raise ConfigError(
                f"Unknown search space '{name_or_path}'. Available: {', '.join(available())}. "
                f"Or pass the path of your own YAML file (see search_spaces/ for examples).")
    if not path.exists():
        raise ConfigError(f"Search space file '{path}' does not exist. Check the path, or use "
                          f"a built-in space: {', '.join(available())}.")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the search space ({e}). Pass a UTF-8 YAML file, "
                          f"or a built-in space: {', '.join(available())}.") from None
    try:
        raw = yaml.safe_load(text)
    except Exception as e:  # PyYAML raises ValueError, RecursionError... for bad scalars/nesting
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{path}: not valid YAML ({first}). "
                          f"Fix the file; see search_spaces/ngram.yaml for the format.") from None
    return parse(raw, source=str(path))


def parse(raw: Any, *, source: str = "<space>") -> SearchSpace:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with `methods:` at the top, got "
                          f"{type(raw).__name__}.")
    unknown = set(raw) - {"name", "description", "methods", "engine", "start_points"}
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {sorted(unknown, key=str)}. "
                          f"Valid: name, description, methods, engine, start_points.")
    methods_raw = raw.get("methods")
    if not isinstance(methods_raw, dict) or not methods_raw:
        raise ConfigError(f"{source}: `methods` must be a non-empty mapping of method name to "
                          f"its parameters, e.g. `methods: {{ngram: {{num_speculative_tokens: "
                          f"{{type: int, low: 1, high: 8}}}}}}`.")
    # The baseline is part of every space: the study measures it first, in the same study.
    methods: dict[str, dict[str, Param | Value]] = {"none": {}}
    schema = vllm_schema()
    for method, params in methods_raw.items():
        if method != "none" and method not in schema.methods:
            raise unknown_name(f"{source}: methods.{method}", "method", method,
                                ("none", *schema.methods), schema.origin,
                                "Fix the method name in the file.")
        params = params or {}
        if not isinstance(params, dict):
            raise ConfigError(f"{source}: methods.{method}: expected a mapping of parameters, "
                              f"got {params!r}.")
        if method == "none" and params:
            raise ConfigError(f"{source}: methods.none takes no parameters.")
        _check_keys(list(params), f"{source}: methods.{method}", schema, method=method)
        methods[str(method)] = _parse_params(params, f"{source}: methods.{method}")
        if method in NEEDS_MODEL and "model" not in params:
            raise ConfigError(f"{source}: methods.{method}: `model` is required ({METHODS[method]}"
                              f"); give the draft/head checkpoint path.")
    engine = _parse_params(raw.get("engine") or {}, f"{source}: engine")
    starts = raw.get("start_points") or []
    if not isinstance(starts, list) or not all(isinstance(s, dict) and all(
            isinstance(k, str) for k in s) for s in starts):
        raise ConfigError(f"{source}: start_points must be a list of mappings with string keys "
                          f"(speculative-config keys, e.g. `- {{method: ngram, "
                          f"num_speculative_tokens: 3}}`).")
    points = []
    for i, start in enumerate(starts):
        # A misspelt key would drop the point silently (params_of finds a searched key missing).
        _check_keys([k for k in start if k != "engine"], f"{source}: start_points[{i}]", schema,
                    method=None)
        check_value(f"{source}: start_points[{i}]", None, start)
        points.append(_start_point(start, f"{source}: start_points[{i}]"))
    name = raw.get("name") or Path(source).stem
    return SearchSpace(name=str(name), description=str(raw.get("description", "")),
                       methods=methods, engine=engine, start_points=tuple(points), source=source)


def _start_point(start: dict[str, Any], where: str) -> Point:
    """A start point as the file writes it: `method`, speculative-config keys and an optional
    `engine:` mapping, each set to one value."""
    method = start.get("method", "none")
    if not isinstance(method, str):
        raise ConfigError(f"{where}.method: expected a method name, got {show(method)}. "
                          f"Fix the start point in the file.")
    engine = start.get("engine") or {}
    if not isinstance(engine, dict) or not all(isinstance(k, str) for k in engine):
        raise ConfigError(f"{where}.engine: expected a mapping of engine knobs to values, "
                          f"got {show(engine)}. Fix the start point in the file.")
    values = [(k, v) for k, v in start.items() if k not in ("method", "engine")]
    for prefix, pairs in ((where, values), (f"{where}.engine", engine.items())):
        for k, v in pairs:
            if not isinstance(v, VALUE_TYPES):
                raise ConfigError(f"{prefix}.{k}: a start point sets each key to one value "
                                  f"(a number, text, true/false or null), got {show(v)}. "
                                  f"Fix the start point in the file.")
    return Point(method=method, values=tuple(values), engine=tuple(engine.items()))


def _parse_params(params: object, where: str) -> dict[str, Param | Value]:
    """A method's (or the engine's) block: each key a fixed value or a Param to search, in
    declaration order, so a bound can name a parameter declared before it."""
    if not isinstance(params, dict):
        raise ConfigError(f"{where}: expected a mapping, got {params!r}.")
    out: dict[str, Param | Value] = {}
    for key, spec in params.items():
        if not isinstance(key, str):
            raise ConfigError(f"{where}: parameter names must be strings, got {key!r}.")
        out[key] = _parse_param(key, spec, f"{where}.{key}", out)
    return out


def _parse_param(key: str, spec: object, path: str, earlier: dict[str, Param | Value]
                 ) -> Param | Value:
    """One block entry: a fixed value (checked), or a Param whose range, references to the
    `earlier` parameters and Optuna distribution are checked."""
    if not isinstance(spec, dict):
        if isinstance(spec, (list, set)):
            raise ConfigError(f"{path}: a list is ambiguous; write "
                              f"`{{type: choice, values: {list(spec)!r}}}` to search it.")
        check_value(path, key, spec)
        if not isinstance(spec, VALUE_TYPES):  # a YAML date or !!binary: no option takes it
            raise ConfigError(f"{path}: {show(spec)} is no value a vLLM option takes; write a "
                              f"number, text, true/false or null (quote a date).")
        return spec  # a fixed value
    values = spec.get("values")
    for i, value in enumerate(values if isinstance(values, (list, tuple)) else ()):
        if not isinstance(value, VALUE_TYPES):
            raise ConfigError(f"{path}.values[{i}]: {show(value)} is no value Optuna can "
                              f"store; a choice is between numbers, texts, true/false or null.")
    try:
        p = Param(**spec)
    except Exception as e:  # pydantic's message names the field
        first = str(e).splitlines()[1:3]
        raise ConfigError(f"{path}: invalid parameter spec {spec!r} ({' '.join(first)}). "
                          f"Use type int/float with low and high, or choice with values."
                          ) from None
    if p.type not in PARAM_TYPES:
        raise ConfigError(f"{path}.type: unknown type '{p.type}'. Valid: "
                          f"{', '.join(PARAM_TYPES)}.")
    if p.type == "choice":
        if not p.values:
            raise ConfigError(f"{path}.values: a choice needs a non-empty list of values.")
        for i, value in enumerate(p.values):
            check_value(f"{path}.values[{i}]", key, value)
    else:
        _check_range(p, key, path)
        _check_references(p, path, earlier)
    _check_distribution(p, path, written=show(spec))
    return p


def _check_range(p: Param, key: str, path: str) -> None:
    """An int or float range: both ends, finite, in the key's bounds, low <= high, a step
    that is positive (and whole for an int), and low > 0 for a log range."""
    if p.low is None or p.high is None:
        raise ConfigError(f"{path}: type {p.type} needs both `low` and `high`.")
    if not all(math.isfinite(v) for v in (p.low, p.high, p.step or 1.0)):
        raise ConfigError(f"{path}: bounds and step must be finite numbers, got low "
                          f"{p.low}, high {p.high}, step {p.step}.")
    if p.type == "int" and (p.low != int(p.low) or p.high != int(p.high)):
        raise ConfigError(f"{path}: int bounds must be integers, got {p.low}..{p.high}.")
    for end, value in (("low", p.low), ("high", p.high)):
        check_value(f"{path}.{end}", key, int(value) if p.type == "int" else value)
    if p.step is not None:
        check_value(f"{path}.step", None, p.step)
    if p.low > p.high:
        raise ConfigError(f"{path}: impossible range: low {p.low} > high {p.high}.")
    if p.log and p.low <= 0:
        raise ConfigError(f"{path}: a log range needs low > 0, got {p.low}.")
    if p.step is not None and p.step <= 0:
        raise ConfigError(f"{path}.step: must be positive, got {p.step}.")
    if p.type == "int" and p.step is not None and p.step != int(p.step):
        raise ConfigError(f"{path}.step: an int range steps by a whole number, got "
                          f"{p.step}. Use a whole step, or type float.")


def _check_references(p: Param, path: str, earlier: dict[str, Param | Value]) -> None:
    """`at_most` / `at_least` name an int or float parameter declared before this one, whose
    range keeps this one's possible: at_most's low >= this low, at_least's high <= this high."""
    for ref in (p.at_most, p.at_least):
        if ref is not None and ref not in earlier:
            raise ConfigError(f"{path}: bound refers to '{ref}', which is not a parameter "
                              f"declared before it in the same block.")
        if ref is not None and isinstance(earlier[ref], Param) and earlier[ref].type == "choice":
            raise ConfigError(f"{path}: bound refers to '{ref}', a choice; only int or "
                              f"float parameters can bound another.")
    if p.at_most is not None:
        ref = earlier[p.at_most]
        ref_low = ref.low if isinstance(ref, Param) else ref
        if not isinstance(ref_low, (int, float)) or ref_low < p.low:
            raise ConfigError(f"{path}: impossible range: at_most {p.at_most} can be "
                              f"below low {p.low}.")
    if p.at_least is not None:
        ref = earlier[p.at_least]
        ref_high = ref.high if isinstance(ref, Param) else ref
        if not isinstance(ref_high, (int, float)) or ref_high > p.high:
            raise ConfigError(f"{path}: impossible range: at_least {p.at_least} can be "
                              f"above high {p.high}.")


def _check_distribution(p: Param, path: str, *, written: str) -> None:
    """Build the Optuna distribution the parameter will be sampled from, so that what Optuna
    refuses (a log range with a step, say) stops the parse instead of the first trial."""
    from optuna import distributions

    try:
        if p.type == "choice":
            distributions.CategoricalDistribution(list(p.values or ()))
        elif p.type == "int":
            distributions.IntDistribution(int(p.low), int(p.high), log=p.log,
                                          step=int(p.step or 1))
        else:
            distributions.FloatDistribution(p.low, p.high, log=p.log, step=p.step)
    except ValueError as e:
        raise ConfigError(f"{path}: Optuna refuses the {p.type} parameter {written}: "
                          f"{str(e).rstrip('.')}. Fix the parameter in the file (a log range "
                          f"samples every value: drop `step`, or `log`).") from None

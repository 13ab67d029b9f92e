"""Input checks, speculative configs: `--speculative-config` as vLLM takes it, and every config
of a search space refused up front where vLLM's own SpeculativeConfig would refuse it only
after an engine launch (tuner.speculative reads what the installed vLLM accepts)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tuner.checks.bounds import show, unknown_name
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec
from tuner.speculative.config_check import vllm_answer
from tuner.speculative.schedule_rules import varying_k
from tuner.speculative.schema import vllm_schema


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
    tuner.speculative.config_check.vllm_answer), or a per-batch-size K schedule for a method
    whose proposer cannot take a changing K (tuner.speculative.schedule_rules.varying_k): one
    message, vLLM's reason in its words, what to do."""
    answer = vllm_answer(spec, model=engine.model)
    shown = show(json.dumps(spec, separators=(",", ":")), 200, quote=True)
    if answer.refused:
        raise ConfigError(f"{where} {shown}: {answer.origin}'s SpeculativeConfig refuses it: "
                          f"\"{answer.refused.rstrip('.')}\". {_what_to_do(spec)} (vLLM would "
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


# The common methods and what each needs besides the target model, for help texts and
# messages. Which methods and keys a vLLM accepts is its own SpeculativeConfig's answer
# (tuner.speculative.schema.vllm_schema): every check reads that, so a method added to vLLM
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

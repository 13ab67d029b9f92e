"""The drafter of a model-based method (draft_model, EAGLE, ...) as tuner.api resolves it for
each command: a user's own (`--draft-model PATH`, checked against the target's tokenizer
before any launch), or the embedded default's made drafter where a space or a speculative
config names it (checks.EMBEDDED_DRAFT), built on first use and only for that target; and,
reading a study, the drafter the study launched. Nothing here launches an engine."""

from __future__ import annotations

from typing import Any

from tuner import checks, engine_cmdline
from tuner.errors import ConfigError
from tuner.records.configs import EngineSpec, TrialConfig
from tuner.records.storage import StudySettings


def resolve(engine: EngineSpec, *, draft_model: str | None, named: str | None, where: str
            ) -> str | None:
    """The drafter to launch on `engine`: `draft_model` (--draft-model) checked against the
    target's tokenizer; else `named` (what the space or the config names), the embedded
    default's made drafter's folder where that is checks.EMBEDDED_DRAFT (built on first use;
    only the embedded default target may take it). `where` names what named it."""
    from tuner.measure import model as embedded
    from tuner.measure import workloads

    if draft_model is not None:
        target = engine.tokenizer or engine.model
        checks.draft_vocabulary(draft_model, workloads.vocabulary(draft_model, what="drafter"),
                                workloads.vocabulary(target, what="target", config=engine.model),
                                target_name=engine.model_name or engine.model)
        return draft_model
    if named != checks.EMBEDDED_DRAFT:
        return named
    if not engine_cmdline.embedded_default(engine):
        name = engine.model_name or engine.model
        raise ConfigError(
            f"{where} is {checks.EMBEDDED_DRAFT}, the drafter made for the embedded default "
            f"model, and the target is {name}, whose tokenizer it does not share. Pass "
            f"--draft-model PATH, a small model with {name}'s tokenizer.")
    return str(embedded.embedded_draft_dir())


def _with_drafter(space: Any, model: str, *, replacing: str | None = None) -> Any:
    """`space` with `model` as the drafter (`model`) of every method that loads one; with
    `replacing`, only of those that name that one."""
    methods = {m: ({**p, "model": model} if m in checks.NEEDS_MODEL and
                   (replacing is None or p.get("model") == replacing) else p)
               for m, p in space.methods.items()}
    return space.model_copy(update={"methods": methods})


def space_drafters(space: Any) -> dict[str, str]:
    """Per method of `space` that loads a drafter, the drafter it names (resolved, once
    drafted_space has run): what a study keeps (StudySettings.drafters)."""
    return {m: p["model"] for m, p in space.methods.items()
            if m in checks.NEEDS_MODEL and isinstance(p.get("model"), str)}


def drafted_space(space: Any, engine: EngineSpec, draft_model: str | None) -> Any:
    """`space` with its drafter resolved (resolve): `draft_model` for every method that loads
    one; else the embedded default's made drafter where the space names it."""
    named = {m: p.get("model") for m, p in space.methods.items() if m in checks.NEEDS_MODEL}
    if draft_model is not None:
        if not named:
            raise ConfigError(f"--draft-model: search space '{space.name}' has no method that "
                              f"loads a drafter ({', '.join(sorted(checks.NEEDS_MODEL))}). Use "
                              f"--space draft, or drop --draft-model.")
        return _with_drafter(space, resolve(engine, draft_model=draft_model, named=None,
                                            where="--draft-model"))
    if checks.EMBEDDED_DRAFT not in named.values():
        return space
    method = next(m for m, d in named.items() if d == checks.EMBEDDED_DRAFT)
    made = resolve(engine, draft_model=None, named=checks.EMBEDDED_DRAFT,
                   where=f"Search space '{space.name}': methods.{method}.model")
    return _with_drafter(space, str(made), replacing=checks.EMBEDDED_DRAFT)


def drafted_config(config: TrialConfig, engine: EngineSpec, draft_model: str | None
                   ) -> TrialConfig:
    """`tuner bench`'s config with its drafter resolved as a space's is: `draft_model`
    (--draft-model) as the `model` of a method that loads one, or the made drafter where the
    config names checks.EMBEDDED_DRAFT."""
    spec = config.speculative_config or {}
    method, named = spec.get("method"), spec.get("model")
    if draft_model is None and named != checks.EMBEDDED_DRAFT:
        return config
    if draft_model is not None:
        if method not in checks.NEEDS_MODEL:
            given = f"method {method}" if method else "no speculative config (the baseline)"
            raise ConfigError(
                f"--draft-model: --speculative-config has {given}, which loads no drafter "
                f"(methods that do: {', '.join(sorted(checks.NEEDS_MODEL))}). Give e.g. "
                f"--speculative-config '{{\"method\":\"draft_model\","
                f"\"num_speculative_tokens\":3}}' with it, or drop --draft-model.")
        if named not in (None, checks.EMBEDDED_DRAFT, draft_model):
            raise ConfigError(
                f"--draft-model {draft_model} and --speculative-config's \"model\": "
                f"\"{named}\" name two drafters for one launch. Give the drafter once: drop "
                f"\"model\" from the JSON, or drop --draft-model.")
    model = resolve(engine, draft_model=draft_model, named=named,
                    where="--speculative-config's \"model\"")
    return config.model_copy(update={"speculative_config": {**spec, "model": model}})


def study_space(space: Any, stored: StudySettings, measured: Any) -> Any:
    """`space` as a study's saved data reads it: where a method names the embedded default's
    made drafter unresolved (checks.EMBEDDED_DRAFT), the drafter the study launched for it,
    stored with the study or (stored before drafters were kept) named by its measured trials'
    configs. No drafter is built or checked: nothing is launched."""
    launched = dict(stored.drafters)
    for t in measured:
        spec = t.config.speculative_config or {}
        if spec.get("method") in checks.NEEDS_MODEL and isinstance(spec.get("model"), str):
            launched.setdefault(spec["method"], spec["model"])
    methods = {m: ({**p, "model": launched[m]} if m in launched and
                   p.get("model") == checks.EMBEDDED_DRAFT else p)
               for m, p in space.methods.items()}
    return space.model_copy(update={"methods": methods})

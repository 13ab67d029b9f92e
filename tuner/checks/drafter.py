"""Input checks, a drafter of the user's own (`--draft-model`): the folder holds a checkpoint,
and its tokenizer is the target's (checked once the target is resolved)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tuner.errors import ConfigError

# A space's `model` that names the embedded default's made drafter (tuner.api resolves it to
# tuner.measure.model.embedded_draft_dir() when the target is the embedded default).
EMBEDDED_DRAFT = "embedded-draft"
# Text whose token ids a drafter's tokenizer must give as the target's does: code, prose,
# digits, spaces and non-ASCII, where tokenizers of different families part.
VOCAB_PROBE = "def area(r):\n    return 3.14159 * r ** 2  # Größe, 面积, naïve café\n"


def draft_model_folder(path: str) -> str:
    """--draft-model: a local folder with a model config (config.json), as vLLM loads a draft
    model or an EAGLE head; its tokenizer is checked against the target's later
    (draft_vocabulary), once the target is resolved."""
    folder = Path(path).expanduser()
    where = f"--draft-model '{path}'"
    if not folder.is_dir():
        what = "is a file" if folder.exists() else "does not exist"
        raise ConfigError(f"{where} {what}. Pass the folder of a draft model (or EAGLE head) "
                          f"checkpoint, with its config.json; it must share the target "
                          f"model's tokenizer.")
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{where}: no readable config.json in it ({_config_why(e)}). Pass the "
                          f"folder that holds the checkpoint's config.json and weights.") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: its config.json is not a JSON object. Pass a Hugging Face "
                          f"checkpoint folder.")
    return str(folder.resolve())


def _config_why(e: Exception) -> str:
    if isinstance(e, FileNotFoundError):
        return "missing"
    return e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"


@dataclass(frozen=True)
class Vocabulary:
    """What a model's tokenizer says of itself, for comparing a drafter with its target:
    config.json's vocab_size (None: unknown), the tokenizer's length and VOCAB_PROBE's ids
    (None: the folder has no tokenizer, as EAGLE heads do)."""

    vocab_size: int | None
    tokens: int | None = None
    probe_ids: tuple[int, ...] | None = None


def draft_vocabulary(draft: str, ours: Vocabulary, target: Vocabulary, *, target_name: str
                     ) -> None:
    """Refuse a drafter whose tokens are not the target's: vLLM would run it, and every draft
    would be rejected (or index past the target's vocabulary)."""
    where = f"--draft-model '{draft}'"
    fix = ("Use a drafter of the target's model family, trained with its tokenizer (for "
           "Llama-3.1-8B, Llama-3.2-1B, for example), or pass the target with --model.")
    if ours.probe_ids is not None and target.probe_ids is not None:
        if ours.tokens != target.tokens:
            raise ConfigError(f"{where}: its tokenizer has {ours.tokens} tokens, the target "
                              f"{target_name}'s {target.tokens}: not the same tokenizer. {fix}")
        if ours.probe_ids != target.probe_ids:
            pairs = zip(ours.probe_ids, target.probe_ids, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b),
                      min(len(ours.probe_ids), len(target.probe_ids)))
            raise ConfigError(f"{where}: its tokenizer splits a test text differently from the "
                              f"target {target_name}'s (token {at}: ids "
                              f"{list(ours.probe_ids[at:at + 3])} against "
                              f"{list(target.probe_ids[at:at + 3])}). {fix}")
    if ours.vocab_size is not None and target.vocab_size is not None and \
            ours.vocab_size != target.vocab_size and ours.probe_ids is None:
        # No tokenizer beside it (an EAGLE head): its embedding's size is what can be compared.
        raise ConfigError(f"{where}: its config.json has vocab_size {ours.vocab_size}, the "
                          f"target {target_name}'s {target.vocab_size}: not the target's "
                          f"vocabulary. {fix}")

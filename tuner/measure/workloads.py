"""Workload stage: a named workload -> the exact list of prompts the load generator sends.

Prompts are built as `vllm bench serve` builds them for the same dataset (same prompt text,
chat template applied where vLLM applies it, same shuffle with the same seed for files read
with Python's `random`, NumPy's generator for `random` as vLLM's RandomDataset, same length
filters), so figures compare with vLLM's own benchmark.
Small samples ship inside the package (xz-compressed); `--dataset-path` reads a local copy of
the full data, plain or as .xz.
Files are read within tuner.checks' size limits, and a prompt that does not fit the engine's
context (prompt + output tokens; vLLM would refuse the request) is skipped and counted.
"""

from __future__ import annotations

import json
import lzma
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuner import checks
from tuner.checks import files as file_checks
from tuner.errors import ConfigError
from tuner.measure import model as embedded
from tuner.records.configs import Prompt, Workload, WorkloadSpec

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
# Stored xz-compressed (5.7 MB -> 1.2 MB) so the package and every copy of the checkout stay
# small; `xz -dk FILE` gives back the plain file (its sha256 is in SOURCE.md).
BUNDLED = {
    "instructcoder": DATA_DIR / "instructcoder" / "editeval.jsonl.xz",
    "sharegpt": DATA_DIR / "sharegpt" / "sharegpt_v3_subset.jsonl.xz",
    "spec_bench": DATA_DIR / "spec_bench" / "question.jsonl.xz",
}
DEFAULT_OUTPUT_LEN = {"instructcoder": 200, "spec_bench": 256, "custom": 256, "sharegpt": None}
SPEC_BENCH_CATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction",
                         "stem", "humanities", "translation", "summarization", "qa",
                         "math_reasoning", "rag")
# The in-package folder; load_tokenizer reads it through embedded_tokenizer_dir() (its
# tokenizer.json is compressed), so tests, scripts and old studies may keep naming it.
EMBEDDED_TOKENIZER = embedded.EMBEDDED_TOKENIZER


def names() -> list[str]:
    return list(_BUILDERS)


def load(spec: WorkloadSpec, *, tokenizer: str | Path, pool: int | None = None,
         max_model_len: int | None = None, say: Callable[[str], None] | None = None
         ) -> Workload:
    """Build the prompts of `spec` with the target model's tokenizer. `pool` asks for more
    prompts than spec.num_prompts (as many as the data has), so each level of a trial gets
    fresh ones; the spec keeps the number the user asked for. Prompts whose prompt + output
    tokens exceed `max_model_len` (the engine's context, when known) are skipped; `say` gets
    one line with their count."""
    if spec.name not in _BUILDERS:
        raise ConfigError(
            f"Unknown workload '{spec.name}'. Available: {', '.join(names())}. "
            f"Use --workload custom --dataset-path FILE.jsonl for your own prompts.")
    if spec.num_prompts < 1:
        raise ConfigError(f"--num-prompts must be at least 1, got {spec.num_prompts}.")
    tok = load_tokenizer(tokenizer)
    build_spec = spec.model_copy(update={"num_prompts": max(pool or 0, spec.num_prompts)})
    ctx = _Context(max_model_len)
    prompts = _BUILDERS[spec.name](build_spec, tok, ctx)
    if ctx.skipped and prompts and say is not None:
        say(f"Skipped {ctx.skipped} prompt(s) that do not fit {ctx.describe()}; "
            f"{len(prompts)} kept.")
    if not prompts and ctx.skipped:
        raise ConfigError(
            f"Workload '{spec.name}': none of its prompts fits {ctx.describe()} ({ctx.skipped} "
            f"skipped). Use shorter prompts or outputs (--output-len, --max-input-tokens, "
            f"--random-input-len), or a larger --max-model-len in --engine-args.")
    if not prompts:
        raise ConfigError(
            f"Workload '{spec.name}' produced no prompts (filters: max input tokens "
            f"{spec.max_input_tokens}, category {spec.category}). Loosen the filters or check "
            f"--dataset-path.")
    return Workload(spec=spec, prompts=tuple(prompts))


PIECE_CHARS = 1 << 16


class _Context:
    """The engine's context in tokens (None: unknown), and how many prompts did not fit it."""

    def __init__(self, max_model_len: int | None) -> None:
        self.max_model_len = max_model_len
        self.skipped = 0

    def describe(self) -> str:
        if self.max_model_len is None:
            return f"any model's context (more than {checks.MAX_TOKENS} tokens)"
        return (f"the model's context of {self.max_model_len} tokens (prompt + output; "
                f"--max-model-len)")

    def count(self, tok: Any, text: str, output_len: int) -> int | None:
        """Prompt tokens of `text`, or None (counted as skipped) when it does not fit."""
        room = (checks.MAX_TOKENS if self.max_model_len is None
                else self.max_model_len - output_len)
        n = count_tokens(tok, text, limit=max(room, 0))
        if n > room:
            self.skipped += 1
            return None
        return n


def count_tokens(tok: Any, text: str, *, limit: int) -> int:
    """Tokens of `text`, exact up to PIECE_CHARS characters; past `limit` it only says "more".
    A longer text is tokenized in pieces cut before a space, where byte-level BPE splits words
    anyway: one call on a 50 MB prompt took the driver to 7.2 GB."""
    if len(text) <= PIECE_CHARS:
        return len(tok(text).input_ids)
    n = len(tok("").input_ids)  # the special tokens (BOS) a whole call would add once
    pos = 0
    while pos < len(text) and n <= limit:
        end = min(pos + PIECE_CHARS, len(text))
        if end < len(text):
            cut = text.rfind(" ", pos + PIECE_CHARS // 2, end)
            end = cut if cut > pos else end
        # verbose=False: a piece may exceed the tokenizer's model_max_length; we only count.
        n += len(tok(text[pos:end], add_special_tokens=False, verbose=False).input_ids)
        pos = end
    return n


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    where = str(path)
    if os.path.realpath(os.path.expanduser(where)) == str(EMBEDDED_TOKENIZER):
        where = str(embedded.embedded_tokenizer_dir())
    try:
        return AutoTokenizer.from_pretrained(where)
    except (OSError, ValueError) as e:
        raise ConfigError(f"Cannot load a tokenizer from '{path}' ({str(e).splitlines()[0]}). "
                          f"Pass --tokenizer PATH or a --model folder with tokenizer files."
                          ) from None


def vocabulary(path: str, *, what: str, config: str | None = None) -> checks.Vocabulary:
    """The vocabulary of the model at `path` (a folder or hub id) for comparing a drafter with
    its target: `config`'s (default: `path`'s) config.json vocab_size where it is a local
    folder, and the tokenizer's size and VOCAB_PROBE's ids where `path` has a tokenizer (a
    local folder without tokenizer files, an EAGLE head, gives none). `what` names the model
    in a message."""
    folder = Path(config or path).expanduser()
    vocab_size = None
    if (folder / "config.json").is_file():
        try:
            vocab_size = json.loads((folder / "config.json").read_text()).get("vocab_size")
        except (OSError, ValueError, AttributeError):
            vocab_size = None
    local = Path(path).expanduser()
    if local.is_dir() and not any((local / f).exists() for f in _TOKENIZER_FILES):
        return checks.Vocabulary(vocab_size=vocab_size if isinstance(vocab_size, int) else None)
    try:
        tok = load_tokenizer(path)
    except ConfigError as e:
        raise ConfigError(f"The {what} '{path}': {str(e).split(' Pass --tokenizer')[0]} Pass a "
                          f"folder whose tokenizer files load with transformers.") from None
    ids = tok(checks.VOCAB_PROBE, add_special_tokens=False)["input_ids"]
    return checks.Vocabulary(vocab_size=vocab_size if isinstance(vocab_size, int) else None,
                             tokens=len(tok), probe_ids=tuple(ids))


# A folder holds a tokenizer when it has one of these (transformers' names).
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


# --- readers ---------------------------------------------------------------------------------
def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl / .json (array) / .parquet file, the first two also xz-compressed
    (.jsonl.xz, .json.xz); a bad line is named by number.

    Only a regular file within tuner.checks' size limits is read (a directory, a device such
    as /dev/zero or a fifo is refused by name), JSONL line by line with a cap on each line, so
    no input can make the driver read without end.
    """
    file_checks.dataset_file(path)
    if path.suffix == ".parquet":
        import importlib.util

        import pandas as pd

        if importlib.util.find_spec("pyarrow") is None:
            raise ConfigError(
                f"{path}: reading a .parquet dataset needs pyarrow, which is not installed. "
                f"Install it with `pip install 'spec-tuner[parquet]'`, or convert the file to "
                f".jsonl (one JSON object a line).")
        try:
            return pd.read_parquet(path).to_dict("records")
        except Exception as e:  # pyarrow raises many types for a broken file
            raise ConfigError(f"{path}: not a readable parquet file ({e}).") from None
    try:
        # Non-blocking: a fifo swapped in since the check above must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as e:
        raise ConfigError(f"Dataset file '{path}': cannot be read ({e.strerror}). Check "
                          f"--dataset-path.") from None
    packed = path.suffix == ".xz"
    with os.fdopen(fd, "rb") as raw:
        file_checks.dataset_stat(path, os.fstat(raw.fileno()))
        # The readers count decompressed bytes, so the size limits hold for .xz files too.
        f = lzma.LZMAFile(raw) if packed else raw
        try:
            whole = (path.with_suffix("") if packed else path).suffix == ".json" or \
                f.read(64 * 1024).lstrip().startswith(b"[")
            f.seek(0)
            rows = _read_json_array(path, f) if whole else _read_jsonl(path, f)
        except (lzma.LZMAError, EOFError) as e:
            raise ConfigError(f"{path}: not a readable .xz file ({e}). Check it with `xz -t`, "
                              f"or pass the decompressed file (`xz -dk`).") from None
        finally:
            if packed:
                f.close()  # leaves `raw` to the with-block
    for n, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise ConfigError(f"{path}: record {n} is {type(row).__name__}, expected a JSON "
                              f"object.")
    return rows


def _read_json_array(path: Path, f: Any) -> list:
    raw = f.read(file_checks.DATASET_MAX_BYTES + 1)
    file_checks.dataset_size(path, len(raw))  # it may have grown since it was checked
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text ({e}).") from None
    del raw
    rows = _parsed(text, invalid=lambda e: f"{path}: invalid JSON at line {e.lineno} column "
                                           f"{e.colno}: {e.msg}.",
                   too_deep=f"{path}: JSON nested too deeply to hold prompts.")
    if not isinstance(rows, list):
        raise ConfigError(f"{path}: expected a JSON array of objects, got "
                          f"{type(rows).__name__}.")
    if "\\ud" in text.lower():  # only a \uXXXX escape can make a lone surrogate
        for n, row in enumerate(rows, 1):
            _refuse_lone_surrogates(path, n, row)
    return rows


def _read_jsonl(path: Path, f: Any) -> list:
    limit = file_checks.DATASET_MAX_LINE_BYTES
    rows: list = []
    n = read = 0

    def not_json(e: json.JSONDecodeError) -> str:  # of line n, the one being read
        return (f"{path}: line {n} is not valid JSON ({e.msg} at column {e.colno}). Each line "
                f"must be one JSON object.")

    while chunk := f.readline(limit + 1):
        read += len(chunk)
        if len(chunk) > limit and not chunk.endswith(b"\n"):
            raise ConfigError(
                f"{path}: line {n + 1} is longer than {limit >> 20} MiB, the limit for one "
                f"record (no model's context holds a prompt that long). Shorten or drop it.")
        file_checks.dataset_size(path, read)  # it may have grown since it was checked
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(f"{path}: line {n + 1} is not UTF-8 text ({e}).") from None
        # splitlines, as before: \r and the other line breaks Python knows end a line too.
        for line in text.splitlines():
            n += 1
            if not line.strip():
                continue
            row = _parsed(line, invalid=not_json,
                          too_deep=f"{path}: line {n} is JSON nested too deeply to hold a "
                                   f"prompt. Each line must be one flat JSON object.")
            if isinstance(row, dict) and "\\ud" in line.lower():
                _refuse_lone_surrogates(path, len(rows) + 1, row)
            rows.append(row)
    return rows


def _parsed(text: str, *, invalid: Callable[[json.JSONDecodeError], str], too_deep: str
            ) -> Any:
    """json.loads, with JSON a user gave as a ConfigError: `invalid` words a syntax error,
    `too_deep` a nesting Python cannot parse."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(invalid(e)) from None
    except RecursionError:
        raise ConfigError(too_deep) from None


def _refuse_lone_surrogates(path: Path, n: int, row: Any) -> None:
    if not isinstance(row, dict):
        return
    for key, value in row.items():
        if _has_lone_surrogate(value):
            raise ConfigError(
                f"{path}: record {n}: '{key}' holds an unpaired surrogate escape "
                f"(\\ud800-\\udfff), which is not text; fix that escape in the file.")


def _has_lone_surrogate(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return True
        return False
    if isinstance(value, dict):
        return any(_has_lone_surrogate(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_lone_surrogate(v) for v in value)
    return False


def _rows(spec: WorkloadSpec) -> tuple[Path, list[dict]]:
    path = Path(spec.dataset_path) if spec.dataset_path else BUNDLED.get(spec.name)
    if path is None:
        raise ConfigError(f"Workload '{spec.name}' needs --dataset-path FILE.jsonl (one JSON "
                          f"object per line with a \"prompt\" field).")
    return path, read_rows(path)


def _field(row: dict, key: str, path: Path, n: int) -> Any:
    if key not in row:
        raise ConfigError(f"{path}: record {n} has no '{key}' field (fields: "
                          f"{', '.join(sorted(map(str, row))) or 'none'}).")
    return row[key]


def _chat(tok: Any, text: str, spec: WorkloadSpec) -> str:
    if spec.skip_chat_template or not getattr(tok, "chat_template", None):
        return text
    return tok.apply_chat_template([{"role": "user", "content": text}],
                                   add_generation_prompt=True, tokenize=False)


def _take(spec: WorkloadSpec, tok: Any, items: Iterator[tuple[str, int | None]],
          ctx: _Context) -> list[Prompt]:
    out = []
    for text, out_len in items:
        default = DEFAULT_OUTPUT_LEN.get(spec.name) or 256
        output_len = int(out_len or spec.output_len or default)
        n_in = ctx.count(tok, text, output_len)
        if n_in is None or (spec.max_input_tokens and n_in > spec.max_input_tokens):
            continue
        out.append(Prompt(prompt=text, prompt_len=n_in, output_len=output_len))
        if len(out) == spec.num_prompts:
            break
    return out


def _shuffled(rows: list, seed: int) -> list:
    rows = list(rows)
    random.Random(seed).shuffle(rows)  # same order as vLLM's random.seed(s); random.shuffle
    return rows


# --- builders --------------------------------------------------------------------------------
def _instructcoder(spec: WorkloadSpec, tok: Any, ctx: _Context) -> list[Prompt]:
    path, rows = _rows(spec)

    def items():
        for n, row in enumerate(_shuffled(rows, spec.seed), 1):
            text = (f"{_field(row, 'input', path, n)}\n\n{_field(row, 'instruction', path, n)} "
                    "Just output the code, do not include any explanation.")
            yield _chat(tok, text, spec), None
    return _take(spec, tok, items(), ctx)


def _sharegpt(spec: WorkloadSpec, tok: Any, ctx: _Context) -> list[Prompt]:
    path, rows = _rows(spec)
    convs = [r for r in rows if len(r.get("conversations") or []) >= 2]
    out = []
    for row in _shuffled(convs, spec.seed):
        try:
            prompt, completion = (str(row["conversations"][i]["value"]) for i in (0, 1))
        except (KeyError, TypeError):
            raise ConfigError(f"{path}: record {row.get('id', '?')} has conversations without "
                              f"'value' fields (ShareGPT format expected).") from None
        n_in = count_tokens(tok, prompt, limit=1024)
        n_out = spec.output_len or count_tokens(tok, completion, limit=2048)
        # vLLM's pruning rules for ShareGPT (is_valid_sequence).
        if n_in < 4 or (spec.output_len is None and n_out < 4) or n_in > 1024 \
                or n_in + n_out > 2048:
            continue
        if ctx.max_model_len is not None and n_in + n_out > ctx.max_model_len:
            ctx.skipped += 1
            continue
        if spec.max_input_tokens and n_in > spec.max_input_tokens:
            continue
        out.append(Prompt(prompt=prompt, prompt_len=n_in, output_len=n_out))
        if len(out) == spec.num_prompts:
            break
    return out


def _spec_bench(spec: WorkloadSpec, tok: Any, ctx: _Context) -> list[Prompt]:
    path, rows = _rows(spec)
    cats = sorted({str(r.get("category")) for r in rows})
    if spec.category and spec.category not in cats:
        raise ConfigError(f"Unknown spec_bench category '{spec.category}'. Available: "
                          f"{', '.join(cats)}.")
    chosen = []
    for n, row in enumerate(rows, 1):
        if spec.category and row.get("category") != spec.category:
            continue
        turns = _field(row, "turns", path, n)
        if not isinstance(turns, list) or not turns:
            raise ConfigError(f"{path}: record {n}: 'turns' must be a non-empty list.")
        chosen.append(str(turns[0]))
    return _take(spec, tok, ((_chat(tok, t, spec), None) for t in _shuffled(chosen, spec.seed)),
                 ctx)


def _custom(spec: WorkloadSpec, tok: Any, ctx: _Context) -> list[Prompt]:
    if not spec.dataset_path:
        raise ConfigError("Workload 'custom' needs --dataset-path FILE.jsonl (one JSON object "
                          "per line with a \"prompt\" field, optional \"output_tokens\").")
    path, rows = _rows(spec)
    items = []
    for n, row in enumerate(rows, 1):
        text = _field(row, "prompt", path, n)
        if not isinstance(text, str) or not text:
            raise ConfigError(f"{path}: record {n}: 'prompt' must be a non-empty string.")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(f"{path}: record {n}: 'prompt' holds an unpaired surrogate escape "
                              f"(\\ud800-\\udfff), which is not text; fix that escape in the "
                              f"file.") from None
        out_len = row.get("output_tokens")
        if out_len is not None and (not isinstance(out_len, int) or isinstance(out_len, bool)
                                    or out_len < 1):
            raise ConfigError(f"{path}: record {n}: 'output_tokens' must be a positive integer, "
                              f"got {out_len!r}.")
        items.append((text, out_len if spec.output_len is None else None))
    shuffled = _shuffled(items, spec.seed)
    return _take(spec, tok, ((_chat(tok, t, spec), o) for t, o in shuffled), ctx)


def _random(spec: WorkloadSpec, tok: Any, ctx: _Context) -> list[Prompt]:
    """vLLM's RandomDataset (vllm/benchmarks/datasets.py, 0.32) with no prefix and range ratio
    0: the same NumPy generator draws, in the same order, so `--seed S` gives the prompts that
    `vllm bench serve --dataset-name random --seed S` sends for the same number of prompts."""
    import numpy as np

    output_len = spec.output_len or spec.random_output_len
    if ctx.max_model_len is not None and spec.random_input_len + output_len > ctx.max_model_len:
        ctx.skipped = spec.num_prompts  # every prompt has this length: none would fit
        return []
    rng = np.random.default_rng(spec.seed)
    n = spec.num_prompts
    input_len = max(0, spec.random_input_len - int(tok.num_special_tokens_to_add()))
    if input_len < 1:
        raise ConfigError(
            f"--random-input-len {spec.random_input_len} leaves no prompt tokens once the "
            f"tokenizer's special tokens are counted. Use --random-input-len 2 or more.")
    # vLLM draws the per-request lengths even when the range is one value: keep the draws so
    # the offsets come from the same place in the generator's stream.
    rng.integers(input_len, input_len + 1, size=n)
    rng.integers(max(output_len, 1), max(output_len, 1) + 1, size=n)
    offsets = rng.integers(0, tok.vocab_size, size=n)
    # vLLM's own expression: the order of this set difference is the order of the tokens.
    allowed = np.array(list(set(np.arange(tok.vocab_size)) - set(tok.all_special_ids)))
    out = []
    for i in range(n):
        ids = allowed[(int(offsets[i]) + i + np.arange(input_len)) % len(allowed)].tolist()
        text, ids = _decode_to_len(tok, ids, input_len, rng)
        out.append(Prompt(prompt=text, prompt_len=len(ids), output_len=output_len))
    return out


def _decode_to_len(tok: Any, ids: list[int], target: int, rng: Any) -> tuple[str, list[int]]:
    """vLLM's gen_prompt_decode_to_target_len: decoded text can re-encode to another length, so
    pad with random tokens or cut, at most ten times; the text and its own token ids."""
    for tries_left in range(10, -1, -1):
        text = tok.decode(ids)
        ids = tok.encode(text, add_special_tokens=False)
        if tries_left == 0 or len(ids) == target:
            break
        if len(ids) < target:
            ids.extend(rng.integers(0, tok.vocab_size, size=target - len(ids)).tolist())
        else:
            ids = ids[:target]
    return text, ids


_BUILDERS: dict[str, Callable[[WorkloadSpec, Any, _Context], list[Prompt]]] = {
    "instructcoder": _instructcoder,
    "sharegpt": _sharegpt,
    "spec_bench": _spec_bench,
    "random": _random,
    "custom": _custom,
}

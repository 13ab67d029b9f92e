"""Replay stage, traffic logs: a file of recorded requests, read one record at a time.

JSONL (one JSON object a line; plain, .gz or .xz, told apart by their first bytes) or
parquet (read a batch of rows at a time with pyarrow). Nothing holds more than one batch of
the file: a log of millions of requests reads in bounded memory. Each record is read once
into a LogRecord, with its line (JSONL) or row (parquet) number, so a message can name it.
A file that is neither, an empty one, or a line that is not one JSON object is refused with a
ConfigError that says where and what to do; a field of the wrong type is kept as Malformed,
refused by the reader only where it reads it (a skipped record's fields never are).
"""

from __future__ import annotations

import gzip
import json
import lzma
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from tuner.errors import ConfigError

MAX_LINE_BYTES = 16 << 20  # one record; no model's context holds a prompt that long
PARQUET_BATCH_ROWS = 1024
_GZIP, _XZ, _PARQUET = b"\x1f\x8b", b"\xfd7zXZ\x00", b"PAR1"
EXAMPLE = '{"messages": [{"role": "user", "content": "..."}], "completion": "..."}'
# The fields of `tuner bench`'s requests.jsonl (tuner.records.results.RequestRecord) that name a
# request of its token capture.
BENCH_FIELDS = ("concurrency", "index", "warmup", "start_s")
PROMPT_FIELDS = ("prompt_token_ids", "messages", "prompt")
ANSWER_ID_FIELDS = ("output_token_ids", "completion_token_ids")
# The fields of a logged chat request that shape its prompt, as vLLM's request reads them.
CHAT_FIELDS = ("messages", "add_generation_prompt", "continue_final_message",
               "chat_template_kwargs", "tools", "documents", "reasoning_effort")


@dataclass(frozen=True)
class Malformed:
    """A field whose value is not of the type the field takes: `got`, the type found."""

    key: str
    got: str


@dataclass(frozen=True)
class BenchKey:
    """A `tuner bench` request record's request in the token capture beside it."""

    concurrency: int
    index: int
    warmup: bool


@dataclass(frozen=True)
class LogRecord:
    """One logged request and its answer, as read from its line or row. The request is one
    of `prompt_ids`, `chat` and `prompt_text` (in that order where a record holds several),
    or `bench` for a `tuner bench` record, whose ids are in the token capture beside it."""

    where: str  # "FILE: line 7" (JSONL) or "FILE: row 7" (parquet)
    fields: tuple[str, ...]  # the record's field names, in its order
    model: str | None = None
    warmup: bool = False  # `"warmup": true`
    failed: bool = False  # an 'error' recorded
    bench: BenchKey | None = None
    prompt_ids: list[int] | Malformed | None = None  # `prompt_token_ids`, or `prompt` as ids
    # `messages` and the other CHAT_FIELDS given, as vLLM's ChatCompletionRequest takes them
    chat: dict[str, Any] | None = None
    prompt_text: str | None = None  # `prompt` as text
    answer_ids: list[int] | Malformed | None = None  # the first of ANSWER_ID_FIELDS given
    completion: str | Malformed | None = None  # the answer's text
    max_tokens: int | None = None  # where an integer
    temperature: float | None = None  # where a number

    @classmethod
    def parse(cls, where: str, row: dict[str, Any]) -> LogRecord:
        """The record of one JSON object (or parquet row)."""
        prompt, prompt_ids, chat, prompt_text = row.get("prompt"), None, None, None
        if row.get("prompt_token_ids") is not None:
            prompt_ids = _token_ids("prompt_token_ids", row["prompt_token_ids"])
        elif row.get("messages") is not None:
            chat = {k: row[k] for k in CHAT_FIELDS if row.get(k) is not None}
        elif isinstance(prompt, list):
            prompt_ids = _token_ids("prompt", prompt)
        elif isinstance(prompt, str):
            prompt_text = prompt
        answer_key = next((k for k in ANSWER_ID_FIELDS if row.get(k) is not None), None)
        completion = row.get("completion")
        if completion is not None and not isinstance(completion, str):
            completion = Malformed("completion", type(completion).__name__)
        bench = None
        if all(k in row for k in BENCH_FIELDS) and not any(
                row.get(k) is not None
                for k in (*PROMPT_FIELDS, *ANSWER_ID_FIELDS, "completion")):
            bench = BenchKey(row["concurrency"], row["index"], bool(row["warmup"]))
        max_tokens, temperature = row.get("max_tokens"), row.get("temperature")
        return cls(
            where=where, fields=tuple(map(str, row)),
            model=None if row.get("model") is None else str(row["model"]),
            warmup=row.get("warmup") is True, failed=bool(row.get("error")), bench=bench,
            prompt_ids=prompt_ids, chat=chat, prompt_text=prompt_text,
            answer_ids=None if answer_key is None else _token_ids(answer_key, row[answer_key]),
            completion=completion,
            max_tokens=max_tokens if isinstance(max_tokens, int) else None,
            temperature=temperature if isinstance(temperature, (int, float)) else None)


def _token_ids(key: str, value: object) -> list[int] | Malformed:
    if not isinstance(value, list) or not all(isinstance(v, int) and v >= 0 for v in value):
        return Malformed(key, type(value).__name__)
    return value


def records(path: Path) -> Iterator[LogRecord]:
    """Every record of `path`, in file order."""
    path = Path(path)
    with _open(path) as raw:
        head = raw.read(8)
        raw.seek(0)
        if head.startswith(_PARQUET):
            yield from _parquet(path)
            return
        packed = (gzip.GzipFile(fileobj=raw) if head.startswith(_GZIP) else
                  lzma.LZMAFile(raw) if head.startswith(_XZ) else None)
        try:
            yield from _jsonl(path, packed or raw)
        except (OSError, EOFError, lzma.LZMAError) as e:
            if packed is None:
                raise
            kind = ".gz" if head.startswith(_GZIP) else ".xz"
            raise ConfigError(f"--traffic {path}: not a readable {kind} file ({e}). Check it "
                              f"with `{'gzip' if kind == '.gz' else 'xz'} -t`, or pass the "
                              f"decompressed file.") from None
        finally:
            if packed is not None:
                packed.close()


def _open(path: Path) -> BinaryIO:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a fifo must not wait for a writer
    except OSError as e:
        raise ConfigError(f"--traffic {path}: cannot be read ({e.strerror}). Pass a JSONL or "
                          f"parquet file of recorded requests.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(f"--traffic {path}: not a regular file. Pass a JSONL or parquet "
                          f"file of recorded requests.")
    return os.fdopen(fd, "rb")


def _jsonl(path: Path, f: BinaryIO) -> Iterator[LogRecord]:
    n = seen = 0
    while chunk := f.readline(MAX_LINE_BYTES + 1):
        if len(chunk) > MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            raise ConfigError(f"{path}: line {n + 1} is longer than "
                              f"{MAX_LINE_BYTES >> 20} MiB, the limit for one record. "
                              f"Shorten or drop it.")
        n += 1
        text = chunk.strip()
        if not text:
            continue
        if seen == 0 and not text.startswith(b"{"):
            raise ConfigError(_not_jsonl(path, text))
        seen += 1
        yield _parsed(f"{path}: line {n}", text)
    if seen == 0:
        raise ConfigError(f"--traffic {path} is empty: no requests to replay. Pass a JSONL "
                          f"file with one request a line, e.g. {EXAMPLE}")


def _not_jsonl(path: Path, text: bytes) -> str:
    if text.startswith(b"["):
        return (f"--traffic {path} holds a JSON array, not one JSON object a line. Convert "
                f"it with `jq -c '.[]' {path.name} > {path.stem}.jsonl` and pass that.")
    return (f"--traffic {path} is neither JSONL (one JSON object a line) nor parquet: its "
            f"first line starts with {text[:20]!r}. Pass one of those, e.g. a line {EXAMPLE}")


def _parsed(where: str, text: bytes) -> LogRecord:
    try:
        row = json.loads(text)
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where} is not UTF-8 text ({e.reason}). Fix or drop "
                          f"that line.") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where} is not valid JSON ({e.msg} at column "
                          f"{e.colno}). Each line must be one JSON object; fix or drop that "
                          f"line.") from None
    except RecursionError:
        raise ConfigError(f"{where} is JSON nested too deeply to hold a request. "
                          f"Fix or drop that line.") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where} is a JSON {type(row).__name__}, not an "
                          f"object. Each line must be one request, e.g. {EXAMPLE}")
    return LogRecord.parse(where, row)


def _parquet(path: Path) -> Iterator[LogRecord]:
    import importlib.util

    if importlib.util.find_spec("pyarrow") is None:
        raise ConfigError(f"--traffic {path}: reading parquet needs pyarrow, which is not "
                          f"installed. Install it with `pip install 'spec-tuner[parquet]'`, "
                          f"or convert the file to JSONL.")
    import pyarrow.parquet as pq

    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH_ROWS)
        n = 0
        for batch in batches:
            for row in batch.to_pylist():
                n += 1
                yield LogRecord.parse(f"{path}: row {n}", row)
    except (OSError, ValueError) as e:  # pyarrow's errors derive from these
        raise ConfigError(f"--traffic {path}: not a readable parquet file ({e}). Check the "
                          f"file, or pass it as JSONL.") from None
    if n == 0:
        raise ConfigError(f"--traffic {path} is empty: the parquet file has no rows to "
                          f"replay.")

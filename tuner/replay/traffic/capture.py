"""Replay stage, traffic capture: a user's logged requests -> their token ids, packed.

Each record is a request and its answer. The request: `prompt_token_ids`, OpenAI-style
`messages` or `prompt` text (tuner.replay.traffic.prompts tokenizes them as vLLM's server
does); the answer: `output_token_ids` / `completion_token_ids` (the ids the engine emitted,
used as they are) or `completion` text. `tuner bench`'s own requests.jsonl keeps its ids in
tokens.npz beside it; those records are matched to them by level, index and warm-up. Warm-ups
and failed requests are skipped, as are requests vLLM would have refused (a prompt longer
than the model's context), each counted with its reason. Optional per record: `model` (one
model a file), `max_tokens`, `temperature`.

The tokenizer is loaded only when a record needs it: the model given, else the one the
records name, else the embedded default's. What is kept is the ids (4 bytes a token, no
text), read a record at a time.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tuner import tokens
from tuner.errors import ConfigError
from tuner.replay.traffic import logs, prompts
from tuner.replay.traffic.logs import LogRecord, Malformed
from tuner.replay.traffic.sweep import Requests

# Tokenizer(name) -> a loaded tokenizer; name None: the embedded default's. Raises ConfigError.
TokenizerFor = Callable[[str | None], Any]


@dataclass
class Traffic:
    """The replayable requests of a traffic file, in file order, and what reading it found."""

    path: Path
    requests: Requests
    max_tokens: np.ndarray
    model: str | None = None  # the model the ids are of, where named
    max_model_len: int | None = None  # its context, where known
    skipped: Counter = field(default_factory=Counter)  # reason -> records
    answers_checked: int = 0  # answers given both as text and as the engine's ids
    answers_differ: int = 0  # of those, text that tokenizes to other ids
    answers_unchecked: int = 0  # given both, but no tokenizer could be loaded to compare them
    text_answers: int = 0  # answers given as text only: nothing to check them against
    sampled: int = 0  # records with a temperature above 0
    greedy: int = 0  # records with temperature 0

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def greedy_only(self) -> bool:
        """Every request says temperature 0: the replay of these requests is exact."""
        return self.greedy == len(self)

    def capture(self, concurrency: int, rows: np.ndarray | None = None) -> tokens.TokenCapture:
        """The requests (or those at `rows`) as one measured level `concurrency` of a token
        capture, indexed in file order."""
        r = self.requests
        picked = range(len(r)) if rows is None else rows.tolist()
        out = []
        for i, row in enumerate(picked):
            s, p, o = int(r.start[row]), int(r.prompt[row]), int(r.output[row])
            out.append(tokens.RequestTokens(
                concurrency=concurrency, index=i, warmup=False, prompt=r.ids[s:s + p],
                output=r.ids[s + p:s + p + o], max_tokens=int(self.max_tokens[row])))
        return tokens.TokenCapture(requests=tuple(out))


def read(path: Path, *, tokenizer_for: TokenizerFor, model: str | None = None,
         max_model_len: int | None = None,
         context_of: Callable[[Any], int | None] | None = None) -> Traffic:
    """The replayable requests of `path` (tuner.replay.traffic.logs reads it). `model`: the
    model (or tokenizer) named by the user, else the records' own; `max_model_len`: the
    engine's, else the model's context (`context_of(tokenizer)`) once a tokenizer is
    loaded. Raises ConfigError naming the record for input it cannot use."""
    reader = _Reader(Path(path), tokenizer_for=tokenizer_for, model=model,
                     max_model_len=max_model_len, context_of=context_of)
    for record in logs.records(reader.path):
        reader.add(record)
    return reader.traffic()


class _Reader:
    """The state of one pass over a traffic file."""

    def __init__(self, path: Path, *, tokenizer_for: TokenizerFor, model: str | None,
                 max_model_len: int | None,
                 context_of: Callable[[Any], int | None] | None) -> None:
        self.path, self.tokenizer_for, self.given = path, tokenizer_for, model
        self.max_model_len, self.context_of = max_model_len, context_of
        self.named: tuple[str, str] | None = None  # (model, where) of the first record naming one
        self.renderer_for: str | None = None  # what the renderer was built for ("" default)
        self.rendering: prompts.Renderer | ConfigError | None = None
        self.ids: list[np.ndarray] = []
        self.lengths: list[tuple[int, int, int]] = []  # prompt, output, max_tokens
        self.out = Traffic(path=path, requests=_pack([], []), max_tokens=np.zeros(0, np.int64))

    # -- one record ---------------------------------------------------------------------
    def add(self, record: LogRecord) -> None:
        self._check_model(record.where, record.model)
        if record.warmup:
            self.out.skipped["warm-up requests"] += 1
            return
        if record.failed:
            self.out.skipped["failed requests (an error recorded)"] += 1
            return
        try:
            if record.bench is not None:
                found = self._bench(record.where, record.bench)
                prompt, output, max_tokens = found.prompt, found.output, found.max_tokens
            else:
                prompt, output = self._prompt(record), self._answer(record)
                max_tokens = record.max_tokens
        except prompts.Refused as e:
            self.out.skipped[f"refused by vLLM's server: {_reason(str(e))}"] += 1
            return
        if not len(output):
            self.out.skipped["empty answers (no token to replay)"] += 1
            return
        ctx = self.max_model_len
        if ctx is not None and len(prompt) + len(output) > ctx:
            self.out.skipped[f"prompt + answer longer than the context ({ctx} tokens)"] += 1
            return
        temperature = record.temperature
        if temperature is not None:
            self.out.sampled += temperature > 0
            self.out.greedy += temperature == 0
        if not isinstance(max_tokens, int) or max_tokens <= 0:
            max_tokens = len(output)
        self.ids.append(np.concatenate([prompt, output]).astype(np.int32))
        self.lengths.append((len(prompt), len(output), max_tokens))

    def _prompt(self, record: LogRecord) -> np.ndarray:
        where = record.where
        if record.prompt_ids is not None:
            return _ids(where, record.prompt_ids)
        if record.chat is not None:
            try:
                return np.asarray(self._renderer().chat(record), np.int32)
            except ValueError as e:
                raise ConfigError(f"{where}: 'messages' is not a chat request vLLM accepts "
                                  f"({e}). Each message needs a 'role' and a 'content'; fix or "
                                  f"drop that line.") from None
        if record.prompt_text is not None:
            return np.asarray(self._renderer().completion(record.prompt_text, record.max_tokens),
                              np.int32)
        raise ConfigError(
            f"{where} has neither 'prompt' nor 'messages' (fields: "
            f"{', '.join(sorted(record.fields)) or 'none'}). Each record needs the request "
            f"as 'prompt' (text), 'messages' (chat) or 'prompt_token_ids', e.g. "
            f"{logs.EXAMPLE}")

    def _answer(self, record: LogRecord) -> np.ndarray:
        where, text = record.where, record.completion
        if isinstance(text, Malformed):
            raise ConfigError(f"{where}: 'completion' is {text.got}, expected the "
                              f"answer's text. Fix or drop that line.")
        if record.answer_ids is not None:
            ids = _ids(where, record.answer_ids)
            if text is not None:
                self._compare(where, ids, text)
            return ids
        if text is not None:
            self.out.text_answers += 1
            return np.asarray(self._renderer().answer(text), np.int32)
        raise ConfigError(f"{where} has no answer: give it as 'completion' (text) or "
                          f"'completion_token_ids', or drop the line (a failed request "
                          f"carries an 'error' field and is skipped).")

    def _compare(self, where: str, ids: np.ndarray, text: str) -> None:
        try:
            renderer = self._renderer()
        except ConfigError:
            self.out.answers_unchecked += 1  # no tokenizer to compare with
            return
        self.out.answers_checked += 1
        self.out.answers_differ += not renderer.same_answer(ids.tolist(), text)

    # -- model, tokenizer, tuner's own records ------------------------------------------------
    def _check_model(self, where: str, name: str | None) -> None:
        if name is None:
            return
        if self.named is None:
            self.named = (name, where)
            if self.renderer_for == "" and self.given is None:
                raise ConfigError(
                    f"{where} names model '{name}', but the records before it named none and "
                    f"were tokenized with the embedded default's tokenizer. Pass --model "
                    f"{name} (or its folder) so every record is tokenized alike.")
        elif name != self.named[0]:
            raise ConfigError(
                f"{where} names model '{name}', but {self.named[1]} named "
                f"'{self.named[0]}': one traffic file holds one model's requests. Keep one, "
                f"e.g. `jq -c 'select(.model == \"{self.named[0]}\")' FILE`.")

    def _renderer(self) -> prompts.Renderer:
        """The renderer of the model's tokenizer, loaded at the first record that needs it
        (a failure to load it is kept and raised again)."""
        if self.rendering is None:
            name = self.given or (self.named[0] if self.named else None)
            self.renderer_for = name or ""
            try:
                tok = self.tokenizer_for(name)
            except ConfigError as e:
                self.rendering = e
                raise
            if self.max_model_len is None and self.context_of is not None:
                self.max_model_len = self.context_of(tok)
            self.rendering = prompts.Renderer(tok, model=name or "default",
                                              max_model_len=self.max_model_len)
        if isinstance(self.rendering, ConfigError):
            raise self.rendering
        return self.rendering

    def _bench(self, where: str, bench: logs.BenchKey) -> tokens.RequestTokens:
        key = (bench.concurrency, bench.index, bench.warmup)
        found = _bench_capture(self.path.parent / tokens.FILE_NAME, where).get(key)
        if found is None:
            raise ConfigError(f"{where}: tuner's request record (level {key[0]}, index "
                              f"{key[1]}) has no token ids in {self.path.parent / tokens.FILE_NAME}"
                              f". Pass the requests.jsonl of the trial folder that wrote it.")
        return found

    def traffic(self) -> Traffic:
        if not self.ids:
            why = "; ".join(f"{n} {reason}" for reason, n in self.out.skipped.most_common())
            raise ConfigError(f"--traffic {self.path}: no request left to replay ({why}).")
        p, o, m = (np.array(col, dtype=np.int64) for col in zip(*self.lengths, strict=True))
        self.out.requests = _pack(self.ids, list(zip(p, o, strict=True)))
        self.out.max_tokens = m
        self.out.model = self.given or (self.named[0] if self.named else None)
        self.out.max_model_len = self.max_model_len
        return self.out


@functools.lru_cache(maxsize=4)
def _bench_capture_cached(path: Path, stamp: tuple[int, int]
                          ) -> dict[tuple[int, int, bool], tokens.RequestTokens]:
    return {(r.concurrency, r.index, r.warmup): r for r in tokens.TokenCapture.load(path).requests}


def _bench_capture(path: Path, where: str) -> dict[tuple[int, int, bool], tokens.RequestTokens]:
    """The token capture beside a `tuner bench` requests.jsonl, by (level, index, warm-up)."""
    try:
        st = path.stat()
        return _bench_capture_cached(path, (st.st_mtime_ns, st.st_size))
    except FileNotFoundError:
        raise ConfigError(f"{where} is a `tuner bench` request record, which keeps no token "
                          f"ids: they are in {tokens.FILE_NAME} beside requests.jsonl, and "
                          f"{path.parent} has none. Pass the requests.jsonl of a trial folder "
                          f"that has its {tokens.FILE_NAME}.") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path}: not a readable token capture ({e}).") from None


def _ids(where: str, value: list[int] | Malformed) -> np.ndarray:
    if isinstance(value, Malformed):
        raise ConfigError(f"{where}: '{value.key}' must be a list of token ids (integers >= 0). "
                          f"Fix or drop that line.")
    return np.asarray(value, dtype=np.int32)


def _pack(ids: list[np.ndarray], lengths: list[tuple[int, int]]) -> Requests:
    p = np.array([a for a, _ in lengths], dtype=np.int64)
    o = np.array([b for _, b in lengths], dtype=np.int64)
    start = np.zeros(len(lengths), dtype=np.int64)
    if len(lengths) > 1:
        start[1:] = np.cumsum(p + o)[:-1]
    return Requests(ids=np.concatenate(ids) if ids else np.zeros(0, np.int32), start=start,
                    prompt=p, output=o)


def _reason(message: str) -> str:
    """vLLM's refusal without its figures, so refusals of one kind count together."""
    if "maximum context length" in message:
        return "prompt longer than the model's context"
    return message.split(". ")[0][:120]

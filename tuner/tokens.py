"""Token capture: each measured request's prompt and output token ids, compactly, with its trial.

At temperature 0 speculative decoding is lossless, so the baseline's token ids decide how many
drafted tokens every step of every n-gram or suffix config would accept (tuner.replay). A
capture holds every request the engine served, warm-ups included, in the order the engine got
them (levels in measurement order, each level's warm-up first), because a suffix cache learns
from every request it sees.

A request also keeps the gaps between its streamed chunks (`chunk_ms`): at concurrency 1
each chunk after the first is one engine step, so with the replayed drafts they give what a
step of each size cost (tuner.replay.cost, the step shape).

On disk and over the wire (a Ray worker hands it back with the result) a capture is one
compressed .npz: the ids of all requests concatenated as int32, per-request columns, and the
chunk gaps concatenated as float32 ms with one count per request (captures written before the
gaps were kept load with none).
"""

from __future__ import annotations

import functools
import hashlib
import io
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FILE_NAME = "tokens.npz"
# The workload sample's requests (RequestSchedule.sample) are stored at this concurrency: no
# level is 0, so `levels()` leaves them out and `sample()` reads them.
SAMPLE_LEVEL = 0
_COLUMNS = ("concurrency", "index", "warmup", "prompt_len", "output_len", "max_tokens")


@dataclass(frozen=True)
class RequestTokens:
    """One request as the engine served it: its prompt ids and the ids it generated."""

    concurrency: int
    index: int
    warmup: bool
    prompt: np.ndarray  # int32, the prompt as the engine tokenized it
    output: np.ndarray  # int32, every generated id, the EOS id included when it stopped there
    max_tokens: int  # the request's max_tokens: an output this long stopped on length
    # ms between its streamed chunks, in order (empty where not recorded); not part of `digest`
    chunk_ms: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32), repr=False,
                                 compare=False)

    @property
    def stopped_on_length(self) -> bool:
        return len(self.output) >= self.max_tokens


@dataclass(frozen=True)
class TokenCapture:
    """Every request of one trial, in the order the engine got them."""

    requests: tuple[RequestTokens, ...]

    def __len__(self) -> int:
        return len(self.requests)

    def levels(self) -> list[int]:
        """The concurrency levels, in the order they were measured."""
        return list(dict.fromkeys(r.concurrency for r in self.requests
                                  if r.concurrency != SAMPLE_LEVEL))

    def sample(self) -> list[RequestTokens]:
        """The workload sample's requests in the order they were sent ([] where none was)."""
        return sorted(self.level(SAMPLE_LEVEL, warmup=False), key=lambda r: r.index)

    def without_sample(self) -> TokenCapture:
        return TokenCapture(requests=tuple(r for r in self.requests
                                           if r.concurrency != SAMPLE_LEVEL))

    def level(self, concurrency: int, *, warmup: bool | None = None) -> list[RequestTokens]:
        return [r for r in self.requests if r.concurrency == concurrency
                and (warmup is None or r.warmup == warmup)]

    @functools.cached_property
    def digest(self) -> str:
        """A hash of every id and column: two captures with one digest hold the same tokens."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(np.array([r.concurrency, r.index, int(r.warmup), len(r.prompt),
                               len(r.output), r.max_tokens], dtype=np.int64).tobytes())
            h.update(np.ascontiguousarray(r.prompt, dtype=np.int32).tobytes())
            h.update(np.ascontiguousarray(r.output, dtype=np.int32).tobytes())
        return h.hexdigest()[:16]

    def output_tokens(self) -> int:
        return sum(len(r.output) for r in self.requests if not r.warmup)

    # -- bytes ------------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        ids = [a for r in self.requests for a in (r.prompt, r.output)]
        table = np.array([[r.concurrency, r.index, int(r.warmup), len(r.prompt), len(r.output),
                           r.max_tokens] for r in self.requests], dtype=np.int64).reshape(-1, 6)
        gaps = [np.asarray(r.chunk_ms, dtype=np.float32) for r in self.requests]
        buf = io.BytesIO()
        np.savez_compressed(
            buf, ids=np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32),
            table=table, columns=np.array(_COLUMNS),
            gaps=np.concatenate(gaps) if gaps else np.zeros(0, np.float32),
            gap_counts=np.array([len(g) for g in gaps], dtype=np.int64))
        return buf.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> TokenCapture:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            ids, table = z["ids"], z["table"]
            columns = tuple(str(c) for c in z["columns"])
            gaps = z["gaps"] if "gaps" in z.files else np.zeros(0, np.float32)
            counts = (z["gap_counts"].tolist() if "gap_counts" in z.files
                      else [0] * len(table))
        if columns != _COLUMNS:
            raise ValueError(f"token capture has columns {columns}, expected {_COLUMNS}")
        if len(counts) != len(table) or sum(counts) != len(gaps):
            raise ValueError(f"token capture is inconsistent: {len(gaps)} chunk gaps, "
                             f"{len(counts)} counts for {len(table)} requests")
        out, pos, at = [], 0, 0
        for (conc, index, warm, plen, olen, max_tokens), n_gaps in zip(table.tolist(), counts,
                                                                        strict=True):
            prompt, output = ids[pos:pos + plen], ids[pos + plen:pos + plen + olen]
            pos += plen + olen
            out.append(RequestTokens(concurrency=conc, index=index, warmup=bool(warm),
                                     prompt=prompt, output=output, max_tokens=max_tokens,
                                     chunk_ms=gaps[at:at + n_gaps]))
            at += n_gaps
        if pos != len(ids):
            raise ValueError(f"token capture is inconsistent: {len(ids)} ids, table says {pos}")
        return cls(requests=tuple(out))

    def save(self, path: Path) -> Path:
        """Write atomically (a reader never sees half a file)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(self.to_bytes())
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: Path) -> TokenCapture:
        return cls.from_bytes(Path(path).read_bytes())

"""The fake engine's completions: what one POST /v1/completions asks of the fake vLLM server
(tuner.testing.fake_engine), which tokens it gets, and the bytes they are written as, exactly
as vLLM writes them.

A word of the prompt is a token (token_id), and output token i is prompt word i, cyclically,
so the ids depend on the prompt alone; an output that stops early ends with EOS_ID.
"""

from __future__ import annotations

import json
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from tuner.testing.fake_pace import ServerState

DEFAULT_MAX_TOKENS = 16  # OpenAI's and vLLM's default for /v1/completions
VOCAB_SIZE = 49152  # SmolLM2's, so fake ids look like the embedded model's
EOS_ID = 2  # the embedded SmolLM2-Instruct's <|im_end|>: an output that stopped on EOS ends with it


def token_id(word: str) -> int:
    """The fake tokenizer: one id per whitespace-separated word, stable across processes
    (hash() is salted per process), never one of SmolLM2's special ids 0-2 (EOS_ID among them)."""
    return 3 + zlib.crc32(word.encode()) % (VOCAB_SIZE - 3)


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def chunk_ends(num_tokens: int, tokens_per_chunk: int) -> list[int]:
    """Index of the last token in each chunk: [0], then steps of tokens_per_chunk to n-1."""
    ends = [0]
    while ends[-1] < num_tokens - 1:
        ends.append(min(ends[-1] + tokens_per_chunk, num_tokens - 1))
    return ends[:num_tokens]


@dataclass(frozen=True)
class CompletionRequest:
    """What the fake reads of a POST /v1/completions body, read once from its JSON."""

    prompt_text: str  # the prompt as text (ids as their list's text)
    words: list[str]  # the fake tokenizer's tokens: the prompt text's words
    prompt_ids: list[int]
    max_tokens: int
    stream: bool = False
    ignore_eos: bool = False
    return_token_ids: bool = False
    include_usage: bool = False  # stream_options.include_usage

    @classmethod
    def parse(cls, body: dict[str, Any]) -> CompletionRequest:
        """Raises ValueError or TypeError for a field of the wrong type."""
        prompt = body.get("prompt", "")
        words = (prompt.split() if isinstance(prompt, str) else []) or ["token"]
        return cls(prompt_text=str(prompt), words=words,
                   prompt_ids=prompt if isinstance(prompt, list) else [token_id(w) for w in words],
                   max_tokens=int(body.get("max_tokens") or DEFAULT_MAX_TOKENS),
                   stream=bool(body.get("stream")), ignore_eos=bool(body.get("ignore_eos")),
                   return_token_ids=bool(body.get("return_token_ids")),
                   include_usage=bool((body.get("stream_options") or {}).get("include_usage")))


@dataclass(frozen=True)
class Completion:
    """What one request gets: its token ids, the chunks they are streamed in (the index of
    each chunk's last token) and how it ends."""

    request: CompletionRequest
    head: str  # the fields every chunk opens with, as a JSON object left open
    output_ids: list[int]
    ends: list[int]
    finish: str

    @property
    def stream(self) -> bool:
        return self.request.stream

    @property
    def words(self) -> list[str]:
        return self.request.words

    @property
    def prompt_ids(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def usage(self) -> dict[str, int]:
        n, prompt_tokens = len(self.output_ids), len(self.prompt_ids)
        return {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + n,
                "completion_tokens": n}

    def text(self, start: int, end: int) -> str:
        return "".join(" " + self.words[t % len(self.words)] for t in range(start, end + 1)
                       if self.output_ids[t] != EOS_ID)

    def chunk(self, i: int, start: int, text: str) -> bytes:
        """Chunk i of the stream, as vLLM writes it."""
        end = self.ends[i]
        reason = json.dumps(self.finish) if i == len(self.ends) - 1 else "null"
        ids = ""
        if self.request.return_token_ids:
            ids = (f',"prompt_token_ids":{_compact(self.prompt_ids) if i == 0 else "null"},'
                   f'"token_ids":{_compact(self.output_ids[start:end + 1])}')
        return (f'data: {self.head},"choices":[{{"index":0,"text":{json.dumps(text)},'
                f'"logprobs":null,"finish_reason":{reason},"stop_reason":null'
                f'{ids}}}]}}\n\n').encode()

    def closing(self, texts: list[str]) -> bytes:
        """The whole answer when not streamed, else the usage chunk (when asked) and [DONE]."""
        if not self.stream:
            choice = {"index": 0, "text": "".join(texts), "logprobs": None,
                      "finish_reason": self.finish, "stop_reason": None}
            if self.request.return_token_ids:
                choice.update(prompt_token_ids=self.prompt_ids, token_ids=self.output_ids)
            return (f'{self.head},"choices":[{json.dumps(choice)}],"usage":'
                    f'{json.dumps(self.usage)}}}').encode()
        tail = ""
        if self.request.include_usage:
            tail = (f'data: {self.head},"choices":[],"usage":'
                    f'{json.dumps(self.usage, separators=(",", ":"))}}}\n\n')
        return (tail + "data: [DONE]\n\n").encode()


def plan(state: ServerState, req: CompletionRequest) -> Completion:
    """What `req` gets from the server of `state`: its tokens, its chunks and how it ends."""
    script = state.script
    max_tokens = req.max_tokens
    n = max_tokens
    if script.output_tokens is not None and not req.ignore_eos:
        n = min(script.output_tokens, max_tokens)
    # Token i of the output is word i of the prompt, cyclically: ids follow from the prompt
    # alone, so every trial of a workload gets the same baseline tokens.
    words = req.words
    output_ids = [token_id(words[t % len(words)]) for t in range(n)]
    finish = "length" if n == max_tokens else "stop"
    if finish == "stop":
        output_ids[-1] = EOS_ID  # counted in usage, as vLLM counts it, with no text
    head = json.dumps({"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                       "created": int(time.time()), "model": state.model},
                      separators=(",", ":"))[:-1]  # open: each chunk appends its fields
    return Completion(request=req, head=head, output_ids=output_ids,
                      ends=chunk_ends(n, script.tokens_per_chunk), finish=finish)

"""Measure stage, one completion request: the streamed /v1/completions request a prompt of a
level sends, and the RequestRecord its response becomes.

Every request asks for the usage of the final stream chunk (the server's own token count) and
for the prompt and output token ids (vLLM's `return_token_ids`); its record holds TTFT,
end-to-end time, chunk gaps and that token count, or the error that ended it, and the ids only
where they are exact (tuner.measure.http_client.Response.token_ids), never an inexact list.
"""

from __future__ import annotations

from pydantic import ValidationError

from tuner.measure.http_client import Slot, Target
from tuner.measure.load_level import LoadLevel, RequestSettings
from tuner.records.configs import Prompt
from tuner.records.results import RequestRecord


async def send(level: LoadLevel, target: Target, slot: Slot, index: int, prompt: Prompt,
               *, origin: float) -> RequestRecord:
    """Send one prompt on `slot` and record how it went."""
    settings = level.settings
    request = target.request({
        "model": settings.model, "prompt": prompt.prompt, "max_tokens": prompt.output_len,
        "temperature": settings.temperature, **sampling(settings), "stream": True,
        "stream_options": {"include_usage": True}, "ignore_eos": settings.ignore_eos,
        "return_token_ids": True})
    resp = await slot.send(request, timeout_s=settings.request_timeout_s)
    fields = dict(
        concurrency=level.concurrency, index=index, warmup=level.warmup,
        start_s=round(resp.start - origin, 6), ttft_s=resp.ttft,
        e2e_s=None if resp.error else resp.end - resp.start,
        prompt_tokens=resp.prompt_tokens or prompt.prompt_len,
        output_tokens=0 if resp.error else resp.out_tokens,
        chunk_gaps_s=tuple(resp.gaps), error=resp.error)
    prompt_ids, output_ids = resp.token_ids() or (None, None)
    try:
        return RequestRecord(**fields, prompt_token_ids=prompt_ids, output_token_ids=output_ids)
    except ValidationError:  # ids that are not integers: keep the timing only
        return RequestRecord(**fields)


def sampling(settings: RequestSettings) -> dict[str, float]:
    """top_p, top_k and min_p where they are not off; when sampling, all three: a server fills
    in what a request leaves out from the model's generation config (vLLM's default), which
    may trim the distribution the study records as untrimmed."""
    values = {"top_p": (settings.top_p, 1.0), "top_k": (settings.top_k, 0),
              "min_p": (settings.min_p, 0.0)}
    return {k: v for k, (v, off) in values.items() if settings.temperature > 0 or v != off}

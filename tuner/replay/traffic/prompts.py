"""Replay stage, traffic prompts: a logged request turned into the ids vLLM's OpenAI server
would have handed the engine, by vLLM's own code (nothing re-implemented).

- `messages` (/v1/chat/completions): vLLM's ChatCompletionRequest builds the chat params
  (add_generation_prompt=True by default), parse_chat_messages reads the messages in the
  content format the template wants, and safe_apply_chat_template renders and tokenizes them
  with no special tokens beyond the template's, as HfRenderer.render_messages does.
- `prompt` text (/v1/completions): the tokenizer with the encode arguments of vLLM's
  TokenizeParams for a CompletionRequest (add_special_tokens=True, its default).
- both: TokenizeParams' own length check; a prompt longer than the model's context is what
  the server refuses with a 400 (`Refused`).
- an answer given as text: the tokenizer, no special tokens.
The few ModelConfig fields those functions read for a text-only model are a plain namespace:
the replay loads no model.
"""

from __future__ import annotations

import logging
import types
from typing import Any

from tuner.errors import ConfigError
from tuner.replay.traffic.logs import LogRecord


class Refused(Exception):
    """vLLM's server would have refused this request (a 400), with vLLM's reason."""


class Renderer:
    """Prompts and answers of one model, tokenized as vLLM's OpenAI server does."""

    def __init__(self, tokenizer: Any, *, model: str, max_model_len: int | None) -> None:
        self.tokenizer, self.model = tokenizer, model
        self.max_model_len = max_model_len
        self.model_config = types.SimpleNamespace(
            model=tokenizer.name_or_path, tokenizer=tokenizer.name_or_path, revision=None,
            tokenizer_revision=None, code_revision=None, trust_remote_code=False,
            max_model_len=max_model_len, encoder_config=None, multimodal_config=None,
            enable_prompt_embeds=False,
            hf_config=types.SimpleNamespace(model_type=None))
        # vLLM logs each format it detects at INFO; the tuner's output stays its own.
        logging.getLogger("vllm").setLevel(logging.WARNING)

    def chat(self, record: LogRecord) -> list[int]:
        """The prompt ids of a chat request (`messages`, and the chat fields it carries)."""
        from pydantic import ValidationError
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.exceptions import VLLMValidationError
        from vllm.renderers.chat_utils import ChatTemplateResolutionError, parse_chat_messages
        from vllm.renderers.hf import (
            resolve_chat_template_content_format,
            safe_apply_chat_template,
        )

        try:
            request = ChatCompletionRequest.model_validate({**(record.chat or {}),
                                                            "model": self.model})
        except ValidationError as e:
            raise ValueError(_first_error(e)) from None
        params = request.build_chat_params(None, "auto")
        mc = self.model_config
        try:
            fmt = resolve_chat_template_content_format(
                params.chat_template, params.chat_template_kwargs.get("tools"),
                params.chat_template_content_format, self.tokenizer, model_config=mc)
            conversation, mm_data, _ = parse_chat_messages(request.messages, mc, fmt)
            if mm_data:
                raise Refused("images, audio or video in the messages (text only is replayed)")
            ids = safe_apply_chat_template(mc, self.tokenizer, conversation,
                                           **params.get_apply_chat_template_kwargs())
            request.build_tok_params(mc).apply_post_tokenization(
                self.tokenizer, {"prompt_token_ids": ids})
        except ChatTemplateResolutionError:
            raise ConfigError(f"The tokenizer of {self.model} has no chat template, so vLLM's "
                              f"server refuses chat requests for it. Pass --model with the "
                              f"model's own folder (its tokenizer_config.json holds the "
                              f"template).") from None
        except VLLMValidationError as e:
            raise Refused(str(e)) from None
        return list(ids)

    def completion(self, prompt: str, max_tokens: int | None) -> list[int]:
        """The prompt ids of a completion request's text prompt."""
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest
        from vllm.exceptions import VLLMValidationError

        try:
            request = CompletionRequest(prompt=prompt, model=self.model, max_tokens=max_tokens)
            params = request.build_tok_params(self.model_config)
            ids = self.tokenizer(prompt, **params.get_encode_kwargs()).input_ids
            params.apply_post_tokenization(self.tokenizer, {"prompt_token_ids": ids})
        except VLLMValidationError as e:
            raise Refused(str(e)) from None
        return list(ids)

    def answer(self, text: str) -> list[int]:
        """An answer's ids, tokenized from its text (no special tokens)."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def same_answer(self, ids: list[int], text: str) -> bool:
        """Whether `text` tokenizes to the ids the engine emitted, up to the one special token
        (the stop token) the engine emits last and the text leaves out."""
        mine = self.answer(text)
        if mine == ids:
            return True
        special = set(self.tokenizer.all_special_ids)
        return len(ids) == len(mine) + 1 and ids[:-1] == mine and ids[-1] in special


def _first_error(e: Any) -> str:
    """The first of a pydantic ValidationError's complaints, in a line."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    return f"{where}: {err.get('msg')}" if where else str(err.get("msg"))


def context_len(tokenizer: Any) -> int | None:
    """The model's context in tokens as vLLM derives it without --max-model-len: the
    smallest length key of its config (vLLM's derive_max_model_len_and_key reads these) where
    one is found beside the tokenizer or in the local cache (never downloaded), capped by the
    tokenizer's model_max_length; None where neither says."""
    lengths = []
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(tokenizer.name_or_path, local_files_only=True)
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        lengths += [v for key in _LENGTH_KEYS
                    if isinstance(v := getattr(text, key, None), int) and v > 0]
    except Exception:  # no config.json beside a bare tokenizer; any other failure says none
        pass
    tok_max = getattr(tokenizer, "model_max_length", None)
    if isinstance(tok_max, int) and 0 < tok_max < _NO_LENGTH:
        lengths.append(tok_max)
    return min(lengths) if lengths else None


_LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
_NO_LENGTH = 10 ** 9  # transformers writes 1e30 where a tokenizer names no length

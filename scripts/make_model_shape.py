#!/usr/bin/env python3
"""Write a model folder that has a real model's shape but no weights, for `--load-format dummy`.

    python3 scripts/make_model_shape.py OUTDIR [--shape llama3-8b] [--tokenizer FILE]

vLLM then serves OUTDIR with random weights of the right size: the real memory traffic, kernels,
KV-cache size and CUDA graphs of that model, with no checkpoint to download (acceptance rates
are meaningless with random weights; see docs/gpu.md). OUTDIR gets config.json,
generation_config.json, tokenizer.json and tokenizer_config.json.

The tokenizer has the Llama-3 id layout (128,000 ordinary ids, then 256 special ids from 128000:
<|begin_of_text|>, <|end_of_text|>, <|eot_id|>, ...) and chat template, so prompts, chat
formatting and stop ids look like the real model's. It is built offline from the SmolLM2
byte-level BPE in tuner/data/tokenizers (49,152 ids of English text and code, so prompt token
counts stay close to a real tokenizer's), padded with filler tokens up to id 127999; every id
decodes. Only the standard library is needed (`tokenizers`/`transformers` check it if present).

Shapes (all share the tokenizer, so any of them can serve as a draft model for another):
  llama3-8b     Llama-3-8B: 32 layers, hidden 4096, 32 heads / 8 KV heads, MLP 14336 (about 16 GB bf16)
  llama3.2-1b   Llama-3.2-1B: 16 layers, hidden 2048, 32 heads / 8 KV heads, MLP 8192, tied embeddings
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import sys
from pathlib import Path

VOCAB = 128256
ORDINARY = 128000  # ids below are ordinary tokens, ids from here on are special

# Llama-3 (3.1 layout) special tokens by offset from 128000; the rest are reserved names.
NAMED_SPECIALS = {
    0: "<|begin_of_text|>", 1: "<|end_of_text|>", 2: "<|reserved_special_token_0|>",
    3: "<|reserved_special_token_1|>", 4: "<|finetune_right_pad_id|>",
    5: "<|reserved_special_token_2|>", 6: "<|start_header_id|>", 7: "<|end_header_id|>",
    8: "<|eom_id|>", 9: "<|eot_id|>", 10: "<|python_tag|>",
}
BOS, EOT, EOS_BASE = 128000, 128009, 128001

CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

_COMMON = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": None, "vocab_size": VOCAB, "bos_token_id": BOS, "eos_token_id": EOT,
    "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
    "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True, "pretraining_tp": 1,
    # Without a version, transformers 5 takes a local folder for an old Mistral one and warns.
    "transformers_version": "5.0.0",
}
SHAPES = {
    "llama3-8b": {**_COMMON, "hidden_size": 4096, "intermediate_size": 14336,
                  "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                  "head_dim": 128, "tie_word_embeddings": False},
    "llama3.2-1b": {**_COMMON, "hidden_size": 2048, "intermediate_size": 8192,
                    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8,
                    "head_dim": 64, "tie_word_embeddings": True},
}

DEFAULT_TOKENIZER = (Path(__file__).resolve().parent.parent / "tuner" / "data" / "tokenizers"
                     / "smollm2-135m-instruct" / "tokenizer.json.xz")  # stored xz-compressed


def special_tokens() -> list[str]:
    names, reserved = [], 3
    for k in range(VOCAB - ORDINARY):
        if k in NAMED_SPECIALS:
            names.append(NAMED_SPECIALS[k])
        else:
            names.append(f"<|reserved_special_token_{reserved}|>")
            reserved += 1
    return names


def build_tokenizer(base: dict) -> dict:
    """The base byte-level BPE, widened to the Llama-3 id layout."""
    if base.get("model", {}).get("type") != "BPE":
        raise SystemExit("the base tokenizer must be a byte-level BPE tokenizer.json")
    tok = json.loads(json.dumps(base))
    vocab: dict[str, int] = tok["model"]["vocab"]
    if sorted(vocab.values()) != list(range(len(vocab))) or len(vocab) > ORDINARY:
        raise SystemExit("the base vocabulary must have dense ids below 128000")
    # Fillers are printable ASCII, which the byte-level decoder maps to itself: every id decodes.
    i = 0
    while len(vocab) < ORDINARY:
        name = f"<filler_{i}>"
        if name not in vocab:
            vocab[name] = len(vocab)
        i += 1
    # The base model's own control tokens stay as plain (unreachable) vocabulary entries.
    tok["added_tokens"] = [
        {"id": ORDINARY + k, "content": name, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True}
        for k, name in enumerate(special_tokens())]
    bos = NAMED_SPECIALS[0]
    seq = lambda s: {"Sequence": {"id": s, "type_id": 0}}  # noqa: E731
    special = {"SpecialToken": {"id": bos, "type_id": 0}}
    tok["post_processor"] = {
        "type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [special, seq("A")],
             "pair": [special, seq("A"), {"SpecialToken": {"id": bos, "type_id": 1}},
                      {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {bos: {"id": bos, "ids": [BOS], "tokens": [bos]}}}]}
    tok["truncation"] = None
    tok["padding"] = None
    return tok


def tokenizer_config() -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": NAMED_SPECIALS[0], "eos_token": NAMED_SPECIALS[9],
        "pad_token": NAMED_SPECIALS[4],
        "model_max_length": 8192, "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE,
    }


def check(out: Path) -> list[str]:
    """Load the folder with whatever tokenizer libraries are importable; returns what was checked."""
    done = []
    try:
        from tokenizers import Tokenizer
    except ImportError:
        Tokenizer = None
    if Tokenizer is not None:
        t = Tokenizer.from_file(str(out / "tokenizer.json"))
        assert t.get_vocab_size() == VOCAB, t.get_vocab_size()
        assert t.token_to_id("<|begin_of_text|>") == BOS and t.token_to_id("<|eot_id|>") == EOT
        assert t.token_to_id("<|reserved_special_token_247|>") == VOCAB - 1
        enc = t.encode("def add(a, b):\n    return a + b  # héllo")
        assert enc.ids[0] == BOS and max(enc.ids[1:]) < ORDINARY, enc.ids
        text = t.decode(enc.ids, skip_special_tokens=True)
        assert text == "def add(a, b):\n    return a + b  # héllo", text
        t.decode(list(range(0, VOCAB, 7)) + [ORDINARY - 1, VOCAB - 1])
        done.append("tokenizers")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        AutoTokenizer = None
    if AutoTokenizer is not None:
        t = AutoTokenizer.from_pretrained(str(out))
        assert len(t) == VOCAB, len(t)
        text = t.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                     add_generation_prompt=True)
        assert text.startswith("<|begin_of_text|><|start_header_id|>user"), text
        assert t.eos_token_id == EOT
        done.append("transformers")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir")
    p.add_argument("--shape", default="llama3-8b", choices=sorted(SHAPES))
    p.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER),
                   help="a byte-level BPE tokenizer.json (or .json.xz) to widen (default: the bundled "
                        "SmolLM2 one)")
    p.add_argument("--no-check", action="store_true", help="skip loading the result back")
    args = p.parse_args(argv)

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    src = Path(args.tokenizer)
    base = json.loads((lzma.decompress(src.read_bytes()) if src.suffix == ".xz"
                       else src.read_bytes()).decode("utf-8"))
    files = {
        "tokenizer.json": build_tokenizer(base),
        "tokenizer_config.json": tokenizer_config(),
        "special_tokens_map.json": {"bos_token": NAMED_SPECIALS[0], "eos_token": NAMED_SPECIALS[9],
                                    "pad_token": NAMED_SPECIALS[4]},
        "config.json": SHAPES[args.shape],
        "generation_config.json": {"bos_token_id": BOS, "eos_token_id": [EOS_BASE, 128008, EOT],
                                   "do_sample": False},
    }
    for name, data in files.items():
        tmp = out / f".{name}.tmp{os.getpid()}"
        tmp.write_text(json.dumps(data, ensure_ascii=False, indent=None if name == "tokenizer.json" else 1),
                       encoding="utf-8")
        os.replace(tmp, out / name)
    checked = [] if args.no_check else check(out)
    print(f"{out}: {args.shape} shape, {VOCAB} token ids"
          + (f" (checked with {', '.join(checked)})" if checked else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

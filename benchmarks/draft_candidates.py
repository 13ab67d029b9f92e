"""Which made drafter to ship for the embedded default: per-position greedy acceptance, offline.

For each candidate drafter (the embedded SmolLM2-135M-Instruct with layers dropped, or with
its weights perturbed or quantised), the target greedily decodes `--output-len` tokens from
each instructcoder prompt; from every prefix of that output the drafter greedily drafts up to
`--k` tokens, and position i counts as accepted when the first i drafts all equal the target's
next i tokens (what vLLM's per-position counters count at temperature 0). All prefixes of a
prompt are drafted in one pass: the drafts form a tree over the target's output, scored with
one cached forward per draft position and a mask that lets each branch see its own prefix only.

    .venv/bin/python benchmarks/draft_candidates.py [--prompts 16] [--output-len 64] [--k 6]
        [--candidates skip2-5,...] [--json benchmarks/data/cpu-draft/candidates.json]
        [--targets /tmp/targets.json]

Candidates: `first8` keeps layers 0-7; `skipA-B` drops layers A..B (`skipA-B+C-D` two blocks); `alt` drops every other
middle layer; `noiseX` adds Gaussian noise of X times each matrix's RMS; `intN` rounds every
matrix to N bits per row (same cost as the target); `self` is the target itself (a check: 1.0).
Cost is the share of the target's layers kept (embedding and LM head are the same for all).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from tuner.measure import model as embedded
from tuner.measure import workloads
from tuner.records.configs import WorkloadSpec

NUM_LAYERS = 30


def with_layers(target: torch.nn.Module, keep: list[int]) -> torch.nn.Module:
    """A copy of the target that runs only the layers `keep`, in order."""
    m = copy.deepcopy(target)
    embedded.keep_layers(m, keep)
    return m


def perturbed(target: torch.nn.Module, *, relative_noise: float, seed: int) -> torch.nn.Module:
    """A copy of the target with Gaussian noise of `relative_noise` x each matrix's RMS added."""
    m = copy.deepcopy(target)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (p for p in m.parameters() if p.ndim == 2):
            rms = p.pow(2).mean().sqrt()
            p.add_(torch.randn(p.shape, generator=g) * rms * relative_noise)
    return m


def quantised(target: torch.nn.Module, *, bits: int) -> torch.nn.Module:
    """A copy of the target with each matrix rounded to `bits` bits, symmetric per row."""
    m = copy.deepcopy(target)
    levels = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for p in (p for p in m.parameters() if p.ndim == 2):
            scale = p.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / levels
            p.copy_((p / scale).round().clamp(-levels, levels) * scale)
    return m


def candidate(name: str, target: torch.nn.Module) -> tuple[torch.nn.Module, float]:
    """A drafter named `name` built from the target, and its cost relative to the target."""
    if name == "self":
        return target, 1.0
    if name.startswith("first"):
        return with_layers(target, list(range(int(name[5:])))), \
            int(name[5:]) / NUM_LAYERS
    if name.startswith("skip"):  # skipA-B, or skipA-B+C-D for two blocks
        blocks = [tuple(int(x) for x in b.split("-")) for b in name[4:].split("+")]
        keep = [i for i in range(NUM_LAYERS) if not any(lo <= i <= hi for lo, hi in blocks)]
        return with_layers(target, keep), len(keep) / NUM_LAYERS
    if name.startswith("alt"):  # alt or altA-B: drop every other layer of A..B
        lo, hi = (int(x) for x in name[3:].split("-")) if "-" in name else (6, 25)
        keep = [i for i in range(NUM_LAYERS) if not (lo <= i <= hi and (i - lo) % 2)]
        return with_layers(target, keep), len(keep) / NUM_LAYERS
    if name.startswith("noise"):
        return perturbed(target, relative_noise=float(name[5:]), seed=0), 1.0
    if name.startswith("int"):
        return quantised(target, bits=int(name[3:])), 1.0
    raise SystemExit(f"unknown candidate {name!r}")


def tree_drafts(drafter: torch.nn.Module, prompt_ids: list[int], out_ids: list[int],
                k: int) -> torch.Tensor:
    """Greedy drafts of `drafter` from every prefix prompt + out_ids[:t], t = 0..len-1: a
    (len(out_ids), k) tensor of token ids."""
    n_p, n_o = len(prompt_ids), len(out_ids)
    seq = torch.tensor([prompt_ids + out_ids[:-1]])  # the last prefix needs no target token
    n_ctx = seq.shape[1]
    from transformers import DynamicCache

    cache = DynamicCache()
    with torch.no_grad():
        out = drafter(input_ids=seq, past_key_values=cache, use_cache=True)
    # Branch t starts from the logits after prompt + out_ids[:t], i.e. at index n_p - 1 + t.
    cur = out.logits[0, n_p - 1:n_p - 1 + n_o].argmax(-1)  # (n_o,)
    drafts = [cur]
    neg = torch.finfo(torch.float32).min
    prefix_ok = torch.arange(n_ctx)[None, :] < (n_p + torch.arange(n_o))[:, None]  # (n_o, n_ctx)
    branch_ok = []  # per earlier draft step: (n_o, n_o) eye, a branch sees its own tokens
    for j in range(1, k):
        branch_ok.append(torch.eye(n_o, dtype=torch.bool))
        allowed = torch.cat([prefix_ok] + branch_ok, dim=1)  # (n_o, n_ctx + j * n_o)
        mask = torch.where(allowed, 0.0, neg)[None, None]
        pos = (n_p + torch.arange(n_o) + j - 1)[None]
        with torch.no_grad():
            out = drafter(input_ids=cur[None], past_key_values=cache, use_cache=True,
                          attention_mask=mask, position_ids=pos)
        cur = out.logits[0].argmax(-1)
        drafts.append(cur)
    return torch.stack(drafts, dim=1)


def acceptance(drafts: torch.Tensor, out_ids: list[int], k: int) -> tuple[list[int], int]:
    """Per position i (1..k): how many prefixes had their first i drafts all right, and the
    number of prefixes counted (those with k target tokens after them)."""
    n = len(out_ids) - k + 1
    if n <= 0:
        return [0] * k, 0
    truth = torch.tensor([out_ids[t:t + k] for t in range(n)])
    ok = (drafts[:n] == truth).int().cumprod(dim=1)
    return ok.sum(0).tolist(), n


def steps(drafts: torch.Tensor, out_ids: list[int], k: int) -> list[int]:
    """Per position, the accepted drafts as vLLM counts them at K=k: a draft at the first
    decode step (after the prefill's token), then one after each verify, which advances by the
    accepted drafts plus one; only drafts with k target tokens after them (the last element:
    how many drafts)."""
    counts, t = [0] * (k + 1), 1
    while t + k <= len(out_ids):
        ok = 0
        while ok < k and int(drafts[t, ok]) == out_ids[t + ok]:
            ok += 1
        for i in range(ok):
            counts[i] += 1
        counts[k] += 1
        t += ok + 1
    return counts


def greedy(target: torch.nn.Module, prompt_ids: list[int], n: int, eos: int) -> list[int]:
    with torch.no_grad():
        out = target.generate(torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False,
                              eos_token_id=eos, pad_token_id=eos)
    return out[0, len(prompt_ids):].tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--k", type=int, default=6)
    ap.add_argument("--steps-k", type=int, default=4,
                    help="also walk the output as vLLM drafts at this K (steps start where the "
                    "last verify ended) and count per position as its counters do")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first", type=int, default=0,
                    help="skip this many prompts first (`tuner bench` sends prompt 0 as its "
                    "warm-up and measures from prompt 1)")
    ap.add_argument("--candidates", default="self,first20,skip12-21,skip10-21,alt,noise0.05,int4")
    ap.add_argument("--check", action="store_true",
                    help="also draft one prompt's prefixes one by one and compare with the tree")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--targets", type=Path,
                    help="a JSON file that keeps the target's greedy outputs between runs")
    ap.add_argument("--table", type=Path, help="print a stored --json run as a table and stop")
    args = ap.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text())))
        return
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    tok = workloads.load_tokenizer(workloads.EMBEDDED_TOKENIZER)
    target = AutoModelForCausalLM.from_pretrained(embedded.embedded_model_dir(),
                                                  dtype=torch.float32).eval()
    spec = WorkloadSpec(name="instructcoder", num_prompts=args.first + args.prompts,
                        seed=args.seed, output_len=args.output_len)
    prompts = workloads.load(spec, tokenizer=workloads.EMBEDDED_TOKENIZER).prompts[args.first:]
    t0 = time.time()
    pairs = []
    stored = json.loads(args.targets.read_text()) if args.targets and args.targets.exists() \
        else {}
    for p in prompts:
        ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
        key = f"{args.output_len}:{p.prompt}"
        if key not in stored:
            stored[key] = greedy(target, ids, args.output_len, tok.eos_token_id)
        pairs.append((ids, stored[key]))
    if args.targets:
        args.targets.write_text(json.dumps(stored))
    print(f"target: {len(pairs)} prompts, {sum(len(o) for _, o in pairs)} tokens "
          f"({time.time() - t0:.0f} s)", file=sys.stderr)
    rows = []
    for name in args.candidates.split(","):
        t0 = time.time()
        drafter, cost = candidate(name, target)
        counts, total = [0] * args.k, 0
        walked = [0] * (args.steps_k + 1)
        for i, (ids, out) in enumerate(pairs):
            if len(out) <= args.k:
                continue
            d = tree_drafts(drafter, ids, out, args.k)
            if args.check and i == 0:
                _check(drafter, ids, out, d, args.k)
            c, n = acceptance(d, out, args.k)
            counts = [a + b for a, b in zip(counts, c, strict=True)]
            walked = [a + b for a, b in zip(walked, steps(d, out, args.steps_k), strict=True)]
            total += n
        per_pos = [c / total for c in counts]
        row = {"candidate": name, "cost_layers": round(cost, 3), "prefixes": total,
               "per_position": [round(x, 4) for x in per_pos],
               "length_at_k": {str(k): round(1 + sum(per_pos[:k]), 3)
                               for k in range(1, args.k + 1)}}
        row["steps"] = {"k": args.steps_k, "drafts": walked[-1],
                        "per_position": [round(x / max(walked[-1], 1), 4) for x in walked[:-1]]}
        rows.append(row)
        print(f"{name:12s} cost {cost:.2f}  per pos "
              + " ".join(f"{x:.3f}" for x in per_pos)
              + f"  length@4 {row['length_at_k'].get('4', float('nan'))}"
              + f"  steps at K={args.steps_k}: "
              + " ".join(f"{x:.3f}" for x in row["steps"]["per_position"])
              + f"  ({time.time() - t0:.0f} s)", flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(
            {"prompts": args.prompts, "first": args.first, "output_len": args.output_len, "seed": args.seed,
             "k": args.k, "dtype": "float32", "rows": rows}, indent=1) + "\n")


def table(run: dict) -> str:
    """A stored run as the markdown table docs/method.md quotes."""
    k = run["k"]
    lines = ["| candidate | layers kept | per-position acceptance, positions 1-"
             f"{k} | acceptance length at K=4 |", "|---|---|---|---|"]
    for row in run["rows"]:
        lines.append(f"| `{row['candidate']}` | {round(row['cost_layers'] * NUM_LAYERS)}/"
                     f"{NUM_LAYERS} | {' '.join(f'{x:.3f}' for x in row['per_position'])} | "
                     f"{row['length_at_k']['4']:.2f} |")
    return "\n".join(lines)


def _check(drafter, ids, out, tree, k) -> None:
    """The tree's drafts against plain greedy decoding of a few prefixes, one at a time."""
    for t in (0, len(out) // 2, len(out) - 1):
        with torch.no_grad():
            g = drafter.generate(torch.tensor([ids + out[:t]]), max_new_tokens=k,
                                 do_sample=False, min_new_tokens=k)
        plain = g[0, len(ids) + t:].tolist()
        if plain != tree[t].tolist():
            print(f"  check: prefix {t}: tree {tree[t].tolist()} plain {plain}", file=sys.stderr)
        else:
            print(f"  check: prefix {t}: same", file=sys.stderr)


if __name__ == "__main__":
    main()

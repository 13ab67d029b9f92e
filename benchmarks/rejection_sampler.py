"""Is vLLM's rejection sampling lossless at temperature > 0 for drafts without probabilities?

n-gram and suffix drafts carry no draft probabilities, so vLLM should accept a draft token d with
the target's probability p(d). This calls the installed vLLM's own rejection sampler
(`vllm.v1.sample.rejection_sampler`) on synthetic requests (a random target distribution, one
point-mass draft per request sampled from it) and prints:

1. the per-token temperature the sampler expands from the per-request one (should equal it);
2. the acceptance of the path the engine takes (sampling constraints, then rejection sampling)
   against the expected mean p(draft);
3. the same kernels given correctly tempered logits.

On the CPU build the sampler's Triton kernels are replaced by C++ ops (no Triton CPU backend);
`--patched` swaps in a dtype-preserving stand-in for the temperature expansion first, as a vLLM
general plugin could. Prints the figures and the build; about a minute on 2 cores.

    .venv/bin/python benchmarks/rejection_sampler.py [--patched] [--requests 400] [--temperature 0.8]
"""

from __future__ import annotations

import argparse

import torch


def patch_expand() -> None:
    """A temperature expansion that writes in the caller's dtype (the CPU build's copies into
    an int64 temporary and drops it)."""
    import vllm.utils.cpu_triton_utils as cpu

    def expand(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
        counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
        src = torch.where(input_val == replace_from,
                          torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
        output[: int(counts.sum())] = torch.repeat_interleave(src, counts).to(output.dtype)

    cpu._expand_kernel_impl = expand


def metadata(temperature: torch.Tensor):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    n = len(temperature)
    return SamplingMetadata(
        temperature=temperature, all_greedy=False, all_random=True, top_p=None, top_k=None,
        generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(n), presence_penalties=torch.zeros(n),
        repetition_penalties=torch.ones(n), output_token_ids=[[] for _ in range(n)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--patched", action="store_true")
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    import vllm
    from vllm.platforms import current_platform

    if args.patched:
        patch_expand()
    current_platform.register_triton_kernel_overrides()  # as vLLM's worker does at start
    import vllm.v1.sample.rejection_sampler as rs

    torch.manual_seed(0)
    n, t = args.requests, args.temperature
    temp = torch.full((n,), t)
    cu = torch.arange(1, n + 1, dtype=torch.int32)
    logits = torch.randn(n, args.vocab) * 2.0
    p = torch.softmax(logits / t, -1)
    draft = torch.multinomial(p, 1).squeeze(1).to(torch.int32)
    expected = p[torch.arange(n), draft.long()].mean().item()
    expanded = rs.expand_batch_to_tokens(temp, cu, n, replace_from=0, replace_to=1)
    bonus = torch.zeros(n, 1, dtype=torch.int64)

    def acceptance(target_logits) -> float:
        hits = 0.0
        for _ in range(args.rounds):
            tl = target_logits() if callable(target_logits) else target_logits.clone()
            out = rs.rejection_sample(draft, [1] * n, 1, cu, None, tl, bonus, metadata(temp))
            hits += (out[:, 0] == draft).float().mean().item()
        return hits / args.rounds

    engine = acceptance(lambda: rs.apply_sampling_constraints(logits.clone(), cu, metadata(temp)))
    direct = acceptance(logits / t)
    print(f"vLLM {vllm.__version__} on {current_platform.device_type}"
          f"{', expansion patched' if args.patched else ''}: {n} requests, vocab {args.vocab}, "
          f"temperature {t}, {args.rounds} rounds")
    print(f"  expanded temperature equals {t}: {(expanded == t).float().mean().item():.1%} "
          f"of tokens (first values {[round(v, 3) for v in expanded[:3].tolist()]})")
    print(f"  acceptance, engine path:            {engine:.4f}   expected mean p(draft) "
          f"{expected:.4f}")
    print(f"  acceptance, tempered logits given:  {direct:.4f}")


if __name__ == "__main__":
    main()

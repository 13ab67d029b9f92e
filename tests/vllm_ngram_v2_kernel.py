"""Run vLLM's own V2 n-gram speculator on the CPU, in Triton's interpreter.

    TRITON_INTERPRET=1 .venv/bin/python tests/vllm_ngram_v2_kernel.py < cases.json > drafts.json

Read by tests/unit/test_replay_ngram_v2.py (it starts this in a child process, so the
interpreter and the two stand-ins below touch no other test). Input: a JSON list of groups
{"min_n", "max_n", "k", "max_model_len", "rows": [[token, ...], ...]}; output: per group, per
row, the K drafts vLLM's NgramGPUSpeculator.propose returns.

What runs is vLLM's: NgramGPUSpeculator.__init__ (its BLOCK_L and block count for the
max_model_len) and .propose, which launches _ngram_scan_kernel and _ngram_finalize_kernel of
vllm/v1/worker/gpu/spec_decode/ngram/speculator.py. Three stand-ins, none of which changes what
a kernel computes:

1. vLLM's CPU build reports no Triton (vllm/triton_utils/importing.py: "Triton is installed,
   but doesn't include CPU backend"), so its `triton.jit` is a no-op placeholder and the
   module's `tl` a stub. Each kernel's own function (its code object, from vLLM's file) is
   rebuilt with the real `triton` and `triton.language` in its globals and jitted by the
   real `triton.jit`, which under TRITON_INTERPRET=1 runs it in Triton's interpreter.
2. The speculator module's HAS_TRITON and `triton` are set to the real ones, so its
   __init__ (which refuses without Triton) computes BLOCK_L and the block count as on a GPU.
3. The interpreter builds the finalize kernel's `slot_valid` mask (speculator.py:139, the
   `&` of an int1 vector and int1 scalars) as int32 0/1, which its own masked load then
   refuses ("mask has unsupported dtype"); compiled Triton keeps it i1. The masked load and
   store take such a mask as bool: each lane's truth value is unchanged.

The request state the kernels read is laid out as the V2 runner leaves it before propose:
all_token_ids holds each row's prompt and output up to total_len, including the token sampled
this step, last_sampled_tokens is that token (v1/worker/gpu/input_batch.py, _post_update_kernel),
num_sampled is 1 (a decode step), idx_mapping the identity.
"""

from __future__ import annotations

import json
import os
import sys
import types


def main() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import numpy as np
    import torch
    import triton
    import triton.language as tl
    import triton.runtime.interpreter as interp
    from vllm.v1.worker.gpu.spec_decode.ngram import speculator as spec

    def as_bool(mask):
        if mask.data.dtype != np.bool_:
            return interp.TensorHandle(mask.data.astype(bool), tl.int1)
        return mask

    load, store = (interp.InterpreterBuilder.create_masked_load,
                   interp.InterpreterBuilder.create_masked_store)
    interp.InterpreterBuilder.create_masked_load = \
        lambda self, ptrs, mask, *a: load(self, ptrs, as_bool(mask), *a)
    interp.InterpreterBuilder.create_masked_store = \
        lambda self, ptrs, value, mask, *a: store(self, ptrs, value, as_bool(mask), *a)

    def real_jit(fn):
        glb = {**fn.__globals__, "tl": tl, "triton": triton}
        f = types.FunctionType(fn.__code__, glb, fn.__name__, fn.__defaults__, fn.__closure__)
        f.__annotations__, f.__module__, f.__qualname__ = \
            fn.__annotations__, fn.__module__, fn.__qualname__
        return triton.jit(f)

    spec._ngram_scan_kernel = real_jit(spec._ngram_scan_kernel)
    spec._ngram_finalize_kernel = real_jit(spec._ngram_finalize_kernel)
    spec.HAS_TRITON, spec.triton = True, triton

    out = []
    for group in json.load(sys.stdin):
        rows, length = group["rows"], group["max_model_len"]
        ns = types.SimpleNamespace
        config = ns(speculative_config=ns(prompt_lookup_min=group["min_n"],
                                          prompt_lookup_max=group["max_n"],
                                          num_speculative_tokens=group["k"]),
                    scheduler_config=ns(max_num_seqs=len(rows)),
                    model_config=ns(max_model_len=length))
        tokens = torch.zeros((len(rows), length), dtype=torch.int32)
        for i, row in enumerate(rows):
            tokens[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
        states = ns(all_token_ids=ns(gpu=tokens),
                    total_len=ns(gpu=torch.tensor([len(r) for r in rows], dtype=torch.int32)))
        proposer = spec.NgramGPUSpeculator(config, torch.device("cpu"), states)
        batch = ns(num_reqs=len(rows), idx_mapping=torch.arange(len(rows), dtype=torch.int64))
        last = torch.tensor([r[-1] for r in rows], dtype=torch.int64)
        drafts = proposer.propose(batch, None, None, None, None,
                                  num_sampled=torch.ones(len(rows), dtype=torch.int32),
                                  num_rejected=torch.zeros(len(rows), dtype=torch.int32),
                                  last_sampled=last, next_prefill_tokens=None,
                                  temperature=None, seeds=None)
        out.append({"block_l": proposer.block_l, "n_blocks": proposer.n_blocks,
                    "drafts": drafts.tolist()})
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()

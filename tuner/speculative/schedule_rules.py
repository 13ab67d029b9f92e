"""What vLLM does with a per-batch-size K table (`num_speculative_tokens_per_batch_size`):
which methods' proposers take a K that changes from step to step (varying_k), and what a
table does to the engine path of the static config it replaces (schedule_path). The one place
these rules live, each read against vLLM's source (the comments say where); the policy
(through tuner.api), the replay and the ladder read them.
"""

from __future__ import annotations

from typing import NamedTuple

from tuner.records.policy import PathChange, PathRule

# --- which methods take a per-batch-size K (num_speculative_tokens_per_batch_size) -----------
# The one place this rule lives: the policy (through tuner.api), the replay
# (tuner.replay.acceptance) and the ladder read it. Read against vLLM 0.32.0's source:
#
# vLLM's scheduler picks K per step from its dense lookup of the schedule, keyed on the number
# of scheduled requests, prefills included (v1/core/sched/scheduler.py:1486-1490,
# `num_spec_tokens_to_schedule = self.dynamic_sd_lookup[len(num_scheduled_tokens)]`), and the
# model runner hands that K to the proposer every step. Whether a varying K is accepted is then
# the proposer's answer, on the runner that runs it:
#
# - V2 model runner (vLLM's GPU default where it supports the method): every speculator gets
#   `num_speculative_tokens=num_spec_tokens` and the runner itself masks the drafts beyond it
#   (v1/worker/gpu/model_runner.py:2251-2256, `draft_tokens[:, num_spec_tokens:] = -1`), so any
#   method V2 runs takes a varying K. The n-gram V2 speculator ignores the K it is passed and
#   always fills all slots (v1/worker/gpu/spec_decode/ngram/speculator.py:234-278); the mask
#   above trims it. V2 does not run suffix, medusa, mlp_speculator or custom_class
#   (config/vllm.py:2927-2934, `_get_v2_model_runner_unsupported_features`): those fall back to
#   V1, which is where they are judged below.
# - V1 model runner (v1/worker/gpu_model_runner.py:4763-5010 passes
#   `num_spec_tokens_to_schedule` to each proposer):
#   ngram: NgramProposer.propose asserts `num_speculative_tokens <= self.k` and drafts up to
#     the K it is given (v1/spec_decode/ngram_proposer.py:148): accepted.
#   ngram_gpu: NgramProposerGPU.propose asserts `num_speculative_tokens == self.k`
#     (v1/spec_decode/ngram_proposer_gpu.py:340): refused on V1, accepted on V2.
#   eagle, eagle3, mtp (and the *_mtp names vLLM maps to mtp), dflash, dspark, draft_model,
#     gemma4/step3p5 MTP: SpecDecodeBaseProposer.propose takes the K it is passed
#     (`self.num_speculative_tokens = num_speculative_tokens`, v1/spec_decode/
#     llm_base_proposer.py:532; step3p5.py:287 the same): accepted.
#   suffix: SuffixDecodingProposer.propose asserts `num_speculative_tokens ==
#     self.num_speculative_tokens` (v1/spec_decode/suffix_decoding.py:43): a K that changes
#     kills the engine at the first step that changes it. Refused.
#   medusa: MedusaProposer.propose asserts the same (v1/spec_decode/medusa.py:47): refused.
#   extract_hidden_states: K is 1 and asserted equal every step
#     (v1/spec_decode/extract_hidden_states.py:35 and :123): refused.
#   custom_class: the runner never passes K to a custom proposer
#     (v1/worker/gpu_model_runner.py:4778-4784): a schedule is ignored, so none is offered.
#   mlp_speculator: no V1 drafter is built for it in 0.32 (gpu_model_runner.py:603-661 has no
#     branch) and V2 refuses it: no schedule.
# Where the runner is unknown (the engine's log says it; tuner.measure.enginepath reads it),
# a method whose answer depends on it is refused: a schedule the engine might crash on is not
# worth a launch.
_VARYING_K_FAMILY = ("eagle", "eagle3", "mtp", "dflash", "dspark", "draft_model")
_FIXED_K = {
    "suffix": "vLLM's suffix proposer asserts that K never changes "
              "(vllm/v1/spec_decode/suffix_decoding.py, SuffixDecodingProposer.propose: "
              "`assert num_speculative_tokens == self.num_speculative_tokens`), so the engine "
              "would crash at the first step whose batch size changes K",
    "medusa": "vLLM's Medusa proposer asserts that K never changes "
              "(vllm/v1/spec_decode/medusa.py, MedusaProposer.propose)",
    "extract_hidden_states": "vLLM's extract_hidden_states proposer drafts exactly one token "
                             "and asserts it every step "
                             "(vllm/v1/spec_decode/extract_hidden_states.py)",
    "custom_class": "vLLM never passes K to a custom proposer "
                    "(vllm/v1/worker/gpu_model_runner.py, propose_draft_token_ids), so a "
                    "schedule would be ignored",
    "mlp_speculator": "vLLM 0.32's model runners build no drafter that takes a per-step K for "
                      "mlp_speculator",
}
_NGRAM_GPU_V1 = ("vLLM's GPU n-gram proposer on the V1 model runner asserts that K never "
                 "changes (vllm/v1/spec_decode/ngram_proposer_gpu.py, NgramProposerGPU.propose: "
                 "`assert num_speculative_tokens == self.k`)")


class VaryingK(NamedTuple):
    """Whether vLLM's proposer for a method takes a K that changes with the batch size (a
    `num_speculative_tokens_per_batch_size` schedule), and why, with the vLLM source that
    says so."""
    accepted: bool
    why: str


def varying_k(method: str | None, *, runner: str | None = None) -> VaryingK:
    """The rule above for `method` ('V1' | 'V2' | None for `runner`, the model runner the
    engine built, where known). vLLM maps the *_mtp names to mtp, and so does this."""
    m = "mtp" if method and method.endswith("_mtp") else method
    if m in _FIXED_K:
        return VaryingK(False, _FIXED_K[m])
    if m == "ngram":
        return VaryingK(True, "vLLM's n-gram proposer drafts up to the K each step passes it "
                              "(V1: vllm/v1/spec_decode/ngram_proposer.py asserts only "
                              "`num_speculative_tokens <= self.k`; V2: the model runner masks "
                              "the drafts beyond K)")
    if m == "ngram_gpu":
        if runner == "V2":
            return VaryingK(True, "on the V2 model runner every speculator's drafts beyond the "
                                  "step's K are masked (vllm/v1/worker/gpu/model_runner.py)")
        return VaryingK(False, _NGRAM_GPU_V1 + ("" if runner == "V1" else
                                                "; the engine's model runner is not known, and "
                                                "on V1 a changing K crashes it"))
    if m in _VARYING_K_FAMILY:
        return VaryingK(True, "vLLM's model-based proposers take the K each step passes them "
                              "(vllm/v1/spec_decode/llm_base_proposer.py, propose: "
                              "`self.num_speculative_tokens = num_speculative_tokens`)")
    return VaryingK(False, f"spec-tuner has not read how vLLM's proposer for method {method!r} "
                           f"takes a changing K, so it offers no schedule for it")


# --- what a K table does to the engine path (num_speculative_tokens_per_batch_size) -----------
# The one place this rule lives (tuner.api hands its answer to the policy, beside varying_k's).
# Read against vLLM 0.26.0's source (the GPU bundle's wheel) and 0.32.0's, which agree:
#
# - VllmConfig.__post_init__ calls `_maybe_override_dynamic_sd_cudagraph_mode`
#   (config/vllm.py: 0.26.0 lines 819-836, 0.32.0 lines 1039-1056): when the speculative config
#   has a table (`uses_dynamic_speculative_decoding()`: the table is not None), the graph mode
#   has full graphs (`CUDAGraphMode.has_full_cudagraphs()`: FULL, FULL_DECODE_ONLY,
#   FULL_AND_PIECEWISE) and the engine is not on Model Runner V2, it warns "Dynamic speculative
#   decoding changes the target verification length at runtime. Overriding cudagraph_mode from
#   %s to PIECEWISE for reliability" and sets PIECEWISE. So a table on the V1 runner runs
#   without full graphs: another engine path than the static config's, whose speed the ladder
#   never measured (measured: benchmarks/data/h100/draft8b-pathcause-c1-128). Which runner a
#   method gets is the version's (`_get_v2_model_runner_unsupported_features`: 0.26.0 runs
#   only eagle, eagle3, mtp, dflash and dspark on V2, so draft_model and ngram tables always
#   take this path there; 0.32.0 keeps only suffix, medusa, mlp_speculator and custom_class on
#   V1), so the rule takes the runner the static config's launch logged.
# - The same __post_init__ drops the table under data parallelism
#   (`_maybe_disable_dynamic_sd_for_data_parallel`, data_parallel_size > 1): static K. The
#   verify launch's counters show it (a table that drafts where it says K=0).
# - On Model Runner V2 the graph mode stays; there, for autoregressive drafters, the table was
#   reported ignored (vLLM issue 51510, fix open when issue 47 was read): not predicted here,
#   named where the verify launch's counters show it.
FULL_GRAPH_MODES = ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
_OVERRIDE_SOURCE = "vllm/config/vllm.py, VllmConfig._maybe_override_dynamic_sd_cudagraph_mode"
_V2_TABLE_IGNORED_ISSUE = 51510
_AUTOREGRESSIVE_DRAFTERS = ("eagle", "eagle3", "mtp", "draft_model")


def autoregressive_drafter(method: str | None) -> bool:
    """Whether `method` drafts position i from the positions before it alone (a draft model,
    an EAGLE head, MTP layers): its K axis follows from one launch (tuner.replay.drafter_k).
    vLLM maps the *_mtp names to mtp, and so does this."""
    m = "mtp" if method and method.endswith("_mtp") else method
    return m in _AUTOREGRESSIVE_DRAFTERS


def schedule_path(method: str | None, *, runner: str | None, cudagraph_mode: str | None
                  ) -> PathRule:
    """What a `num_speculative_tokens_per_batch_size` table does to the engine path of the
    static config of `method` that ran on `runner` ('V1' | 'V2' | None: not known) with
    `cudagraph_mode` (vLLM's CUDAGraphMode name; None: not known), by the rule above: the
    path fields it changes and where vLLM does it; no change where the static path is not
    known. (Data parallelism, which drops the table, is not read from the engine's flags.)"""
    m = "mtp" if method and method.endswith("_mtp") else method
    if runner == "V1" and cudagraph_mode in FULL_GRAPH_MODES:
        return PathRule(changes=(PathChange(field="cudagraph_mode", static=cudagraph_mode,
                                            schedule="PIECEWISE"),),
                        vllm_source=_OVERRIDE_SOURCE)
    return PathRule(ignored_issue=_V2_TABLE_IGNORED_ISSUE
                    if runner == "V2" and m in _AUTOREGRESSIVE_DRAFTERS else None)

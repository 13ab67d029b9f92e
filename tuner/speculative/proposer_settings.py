"""The keys of a `--speculative-config` that spec-tuner drafts by itself (the replay steps
vLLM's proposers with them; the fake engine counts by them), read once into ProposerSettings,
with vLLM's defaults where a key is left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.records.configs import TrialConfig

# Where a --speculative-config leaves them out, vLLM's defaults (vllm/config/speculative.py):
# the n-gram window is 5-5 when neither end is set, and one end copies the other.
NGRAM_WINDOW_DEFAULT = 5


@dataclass(frozen=True)
class ProposerSettings:
    """The keys of a --speculative-config that spec-tuner drafts by itself (the replay steps
    vLLM's proposers with them, tuner.replay.acceptance; the fake engine counts by them), read
    once from the config, with vLLM's defaults where a key is left out."""

    method: str | None
    k: int | None  # TrialConfig.k: None where vLLM reads it from the draft model
    prompt_lookup_min: int = NGRAM_WINDOW_DEFAULT
    prompt_lookup_max: int = NGRAM_WINDOW_DEFAULT
    # num_speculative_tokens_per_batch_size, as (first batch size, last, K); () for none
    k_schedule: tuple[tuple[int, int, int], ...] = ()
    # SuffixDecodingProposer's settings (suffix_decoding_*)
    suffix_max_tree_depth: int = 24
    suffix_max_cached_requests: int = 10000
    suffix_max_spec_factor: float = 1.0
    suffix_min_token_prob: float = 0.1

    @classmethod
    def of(cls, config: TrialConfig) -> ProposerSettings | None:
        """`config`'s settings; None without speculation. Raises ValueError for a K schedule
        that is not a list of (start, end, K) entries."""
        spec = config.speculative_config
        if not spec:
            return None
        lo, hi = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
        if lo is None and hi is None:
            lo = hi = NGRAM_WINDOW_DEFAULT
        lo = hi if lo is None else lo
        hi = lo if hi is None else hi
        schedule = spec.get("num_speculative_tokens_per_batch_size") or []
        if not isinstance(schedule, list) or not all(
                isinstance(e, (list, tuple)) and len(e) == 3 for e in schedule):
            raise ValueError(f"num_speculative_tokens_per_batch_size {schedule!r} is not a "
                             f"list of (first batch size, last batch size, K) entries")

        def suffix(name: str) -> Any:
            given = spec.get(f"suffix_decoding_{name}")
            return getattr(cls, f"suffix_{name}") if given is None else given

        return cls(method=spec.get("method"), k=config.k, prompt_lookup_min=int(lo),
                   prompt_lookup_max=int(hi), k_schedule=tuple(tuple(e) for e in schedule),
                   suffix_max_tree_depth=suffix("max_tree_depth"),
                   suffix_max_cached_requests=suffix("max_cached_requests"),
                   suffix_max_spec_factor=suffix("max_spec_factor"),
                   suffix_min_token_prob=suffix("min_token_prob"))

    @property
    def window(self) -> tuple[int, int]:
        """The n-gram window: (prompt_lookup_min, prompt_lookup_max)."""
        return self.prompt_lookup_min, self.prompt_lookup_max

"""Keys of records as older study folders stored them: the one place they are named."""

from __future__ import annotations

# Keys of LevelMetrics as stored before they took vLLM's names; LevelMetrics.migrate renames
# them (and turns the acceptance rate, then a fraction, into vLLM's percentage).
OLD_LEVEL_KEYS = {"spec_decode_num_draft_tokens": "spec_decode_draft_tokens",
                   "spec_decode_num_accepted_tokens": "spec_decode_accepted_tokens"}

RETIRED_SETTINGS = ("stability_max_s", "min_window_s")

# Keys of policy.json's document and its verification as stored before the line in words was
# named apart from the recommendation's Verdict record (a record of figures).
OLD_POLICY_KEYS = {"verdict": "headline"}


def renamed(data: object, old_keys: dict[str, str]) -> object:
    """A stored record's `data` with its old keys under their new names (other data as is)."""
    if not isinstance(data, dict) or not old_keys.keys() & data.keys():
        return data
    return {old_keys.get(k, k): v for k, v in data.items()}

"""Keys of records as older study folders stored them: the one place they are named."""

from __future__ import annotations

# Keys of LevelMetrics as stored before they took vLLM's names; LevelMetrics.migrate renames
# them (and turns the acceptance rate, then a fraction, into vLLM's percentage).
OLD_LEVEL_KEYS = {"spec_decode_num_draft_tokens": "spec_decode_draft_tokens",
                   "spec_decode_num_accepted_tokens": "spec_decode_accepted_tokens"}

RETIRED_SETTINGS = ("stability_max_s", "min_window_s")

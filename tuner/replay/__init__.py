"""Replay stage: what n-gram and suffix configs would do, predicted from the baseline's tokens."""

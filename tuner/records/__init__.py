"""Typed, immutable records that cross module boundaries, one module per concern:

- configs: what is asked (the workload and its prompts, the engine, a candidate config, how
  each level is driven, the requests every launch of a study sends);
- results: what was measured and decided (requests, levels, launches, trial outcomes, the
  speedup split, recommendations);
- options: one record per command, built once from the command line;
- storage: the names a study's settings and its trials' records are stored under;
- migrations: the keys older study folders stored, read in one place.

Every stage hands the next one of these, never a loose dict.
"""

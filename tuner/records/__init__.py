"""Typed, immutable records that cross module boundaries, one module per concern:

- configs: what is asked (the workload and its prompts, the engine, a candidate config, how
  each level is driven, the requests every launch of a study sends);
- results: what was measured (requests, levels, launches, what a `tuner bench` run asked);
- trials: why a trial stands in a study (its role), and what it produced or why it failed;
- speedup: a measured figure with its spread, the split of a speedup, the wording of a ratio;
- recommendations: what analysis decided per level, its verdict as figures, and its words;
- predictions: a row the replay predicted (a config at a level), as predicted.csv and
  traffic.csv hold it, and where the replay missed a measurement;
- policy: the load-aware policy document (policy.json) and the ladder runs it rests on;
- verification: what `tuner verify` measured out of sample against a study's intervals;
- outcomes: what a command hands the command line once it is done;
- options: one record per command, built once from the command line;
- storage: the names a study's settings and its trials' records are stored under;
- migrations: the keys older study folders stored, read in one place.

Every stage hands the next one of these, never a loose dict: a JSON-shaped dict is left only
where JSON, YAML or an HTTP body is read or written (the --speculative-config vLLM takes,
Optuna's attrs and journal, a user's log record).
"""

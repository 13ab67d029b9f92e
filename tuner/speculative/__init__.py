"""What vLLM's SpeculativeConfig accepts, for the vLLM installed in this Python, and the rules
spec-tuner reads from vLLM's source about speculation. A base package, beside records and
errors: settings (the `--speculative-config` flag), search (the YAML spaces), the replay and
the policy all read it, and it imports no stage. One module per concern:

- schema: its speculative methods and `--speculative-config` keys (vllm_schema);
- config_check: vLLM's own checks of a `--speculative-config`, run without an engine
  (vllm_answer);
- schedule_rules: which methods take a per-batch-size K (varying_k), and what such a table
  does to the engine path (schedule_path);
- proposer_settings: the keys spec-tuner drafts by itself (ProposerSettings).
"""

"""Search stage: search spaces, the Optuna storage (the single truth), the ask/tell loop, executors and campaigns."""

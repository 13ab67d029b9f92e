"""Measure stage: one engine launch driven by the load generator -> BenchResult. Knows nothing of Optuna or Ray."""

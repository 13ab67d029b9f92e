"""Analysis stage: pure functions of stored results (frames, Pareto fronts, recommendations, policy rules). Never touches an engine."""

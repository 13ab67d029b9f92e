"""Outputs stage: report, plots, console lines and atomic files, rendered from analysis results."""

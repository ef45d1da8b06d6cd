"""Evaluations: datasets and splits, suites, eval jobs, scorers (and their sandbox), gates."""

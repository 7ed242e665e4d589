"""Sweeps: many runs of one job, each with its own parameters (issue 51)."""

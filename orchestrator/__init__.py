"""Cluster orchestration: sandbox clusters, preflight, code sync, torchrun launch, logs."""

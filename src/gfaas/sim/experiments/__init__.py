"""Simulator experiments, one per paper figure: ``gfaas sim list`` / ``gfaas sim run NAME``."""

from . import cluster_day, dscs, moa, passing, scaling, storage, workloads  # noqa: F401  (registration)
from .base import REGISTRY, Comparison, Experiment, Result, run_experiment

__all__ = ["REGISTRY", "Comparison", "Experiment", "Result", "run_experiment"]

"""Hyperparameter studies for PyTorch models on GPUs, on top of Optuna."""

from __future__ import annotations

__version__ = "0.1.0"

"""Tabular models: logistic regression for credit-risk scoring."""

from __future__ import annotations

import math

from .builder import GraphBuilder
from .signature import Signature

LOGREG_FEATURES = 32


def define_logreg(b: GraphBuilder, scale: str, debug: bool = False) -> Signature:
    """``prob = sigmoid(features @ w + b)``: 32 weights and one bias (33 parameters) at every scale;
    the model is already tiny, so "small" is the same model."""
    w = b.param("linear.weight", (LOGREG_FEATURES, 1), std=1.0 / math.sqrt(LOGREG_FEATURES))
    # A random (not zero) intercept: a scorecard's base rate is rarely 50%, and a dropped bias would
    # then show in the oracle test.
    bias = b.param("linear.bias", (1,), std=0.5)
    z = b.op("Add", [b.op("MatMul", ["features", w], "linear"), bias], "linear.add")
    b.rename(b.op("Sigmoid", [z], "sigmoid"), "prob")
    return Signature({"features": (("N", LOGREG_FEATURES), "float32")}, {"prob": (("N", 1), "float32")})

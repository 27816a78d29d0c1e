"""Stand-in models with the zoo's input and output shapes, for running the workflows' handlers where
the model zoo is not wanted (unit tests of the handlers, data-size accounting).

A stub computes cheap deterministic functions of its inputs (channel means through a fixed random
matrix, a fixed anchor grid with pseudo-random scores seeded by the input), never a network. Use the
real zoo (:mod:`gfaas.models`) for anything that measures compute.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Input sides per scale: the zoo's full-scale sizes; small matches the zoo's small scale.
SIDES = {"small": {"yolo": 64, "default": 64}, "full": {"yolo": 416, "default": 224}}
SEQ_LEN = {"small": 32, "full": 128}
OUTPUTS = {"resnet50": 1000, "efficientnet_b0": 1000, "vit_b16": 1000}


@dataclass(frozen=True)
class StubInfo:
    """Like the zoo's ``ModelInfo``: ``inputs`` holds example shapes (batch 1), ``dynamic_inputs`` the
    graph's shapes with symbolic (str) dimensions."""

    name: str
    inputs: dict[str, tuple[tuple[int, ...], str]]
    dynamic_inputs: dict[str, tuple[tuple[int | str, ...], str]]
    vocab_size: int | None = None
    outputs: tuple[str, ...] = field(default=())


class StubModel:
    """``model(**feeds) -> dict of arrays`` with the shapes the zoo documents for ``name``."""

    def __init__(self, name: str, scale: str = "small") -> None:
        self.name = name
        rng = np.random.default_rng(zlib.crc32(name.encode()))
        if name == "bert_base":
            n = SEQ_LEN[scale]
            self.info = StubInfo(name, {"input_ids": ((1, n), "int64"), "attention_mask": ((1, n), "int64")},
                                 {"input_ids": (("N", "L"), "int64"), "attention_mask": (("N", "L"), "int64")},
                                 30522, ("hidden", "pooled", "logits"))
            self._emb = rng.normal(size=(30522, 8)).astype(np.float32)
            self._w = rng.normal(size=(8, 2)).astype(np.float32)
            return
        side = SIDES[scale].get(name, SIDES[scale]["default"])
        self.info = StubInfo(name, {"image": ((1, 3, side, side), "float32")},
                             {"image": (("N", 3, side, side), "float32")}, None,
                             ("boxes", "scores") if name == "yolo" else ("logits",))
        self._w = rng.normal(size=(3, 21 if name == "fcn" else OUTPUTS.get(name, 1000))).astype(np.float32)
        self.side = side

    def __call__(self, **feeds: np.ndarray) -> dict[str, np.ndarray]:
        for k, (shape, dtype) in self.info.inputs.items():
            v = feeds[k]
            if v.dtype != np.dtype(dtype) or v.shape[1:] != shape[1:]:
                raise ValueError(f"stub {self.name}: input {k} {v.dtype}{list(v.shape)}, expected {dtype}{list(shape)}")
        if self.name == "bert_base":
            ids, mask = feeds["input_ids"], feeds["attention_mask"]
            e = (self._emb[ids] * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
            n, length = ids.shape
            return {"logits": (e @ self._w).astype(np.float32), "pooled": np.zeros((n, 768), np.float32),
                    "hidden": np.zeros((n, length, 768), np.float32)}
        x = feeds["image"]
        if self.name == "fcn":
            return {"logits": np.einsum("nchw,ck->nkhw", x, self._w).astype(np.float32)}
        if self.name == "yolo":
            return self._detect(x)
        return {"logits": (x.mean(axis=(2, 3)) @ self._w).astype(np.float32)}

    def _detect(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """Boxes: a fixed grid of square anchors at three sizes (half-overlapping); scores: uniform
        pseudo-random numbers seeded by the input's bytes, so the same frame gets the same scores."""
        s = self.side
        grids = []
        for size in (s / 8, s / 4, s / 2.5):
            centres = np.arange(size / 2, s, size / 2)
            cx, cy = np.meshgrid(centres, centres)
            grids.append(np.stack([cx.ravel(), cy.ravel(), np.full(cx.size, size), np.full(cx.size, size)], axis=1))
        anchors = np.concatenate(grids).astype(np.float32)
        scores = np.stack([np.random.default_rng(zlib.crc32(np.ascontiguousarray(img).tobytes()))
                           .random((len(anchors), 80), dtype=np.float32) for img in x])
        return {"boxes": np.broadcast_to(anchors, (len(x), *anchors.shape)).copy(), "scores": scores}


def stub_models() -> Callable[[str, str], Any]:
    """A model source for :func:`gfaas.workflows.run_local`: ``(name, scale) -> StubModel``, cached."""
    cache: dict[tuple[str, str], StubModel] = {}

    def get(name: str, scale: str) -> StubModel:
        if (name, scale) not in cache:
            cache[(name, scale)] = StubModel(name, scale)
        return cache[(name, scale)]

    return get

"""What a model definition returns: its graph inputs and outputs (with symbolic dims) and the value
each symbolic dim takes in the zoo's default shapes."""

from __future__ import annotations

from dataclasses import dataclass, field

from .builder import Dim

TensorSig = tuple[tuple[Dim, ...], str]


@dataclass(frozen=True)
class Signature:
    inputs: dict[str, TensorSig]
    outputs: dict[str, TensorSig]
    # Symbolic dim -> default size; "N" (batch) is always 1 in the defaults.
    defaults: dict[str, int] = field(default_factory=dict)
    vocab_size: int | None = None
    max_seq_len: int | None = None

    def concrete(self, sig: TensorSig, batch: int = 1) -> TensorSig:
        sizes = {**self.defaults, "N": batch}
        shape, dtype = sig
        return tuple(sizes[d] if isinstance(d, str) else d for d in shape), dtype

"""Real model scaling on one machine: node processes in network namespaces on rate-limited links
move a model's blocks by a multicast schedule and serve requests while the copies complete.

:data:`SCALE_CONFIG` is the model the experiments move: a Llama-style decoder whose blocks are
nearly equal in size (a small vocabulary keeps the embedding and the LM head no larger than a
layer pair), with 2-3 ms of CPU per decoded token, so that the links, not the two CPUs of the host,
set the pace: at 40 Mbit/s per port a block takes 0.3 s on a link, as a 7B model's block would on a
fast NIC, while serving on eight nodes leaves CPU to spare.
"""

from __future__ import annotations

from ..models.llm import LlamaConfig

#: 16 layers of 0.79 MB (float32) and an embedding and LM head of 0.26 MB each: 8 blocks of
#: 1.58-1.84 MB, 13.1 MB in all.
SCALE_CONFIG = LlamaConfig(vocab=512, dim=128, n_layers=16, n_heads=4, n_kv_heads=2, hidden=384, max_seq=512)

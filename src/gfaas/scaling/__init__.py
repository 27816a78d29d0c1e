"""Real model scaling on one machine: node processes in network namespaces on rate-limited links
move a model's blocks by a multicast schedule and serve requests while the copies complete.

:data:`SCALE_CONFIG` is the model the experiments move: a Llama-style decoder whose blocks are
nearly equal in size (a small vocabulary keeps the embedding and the LM head no larger than a
layer pair), with a few milliseconds of CPU per decoded token, so that the links, not the two
CPUs of the host, set the pace.
"""

from __future__ import annotations

from ..models.llm import LlamaConfig

#: 16 layers of 3 MB (float32) and an embedding/LM head of 1 MB each: 8 blocks of 6-7 MB, 50 MB in all.
SCALE_CONFIG = LlamaConfig(vocab=1024, dim=256, n_layers=16, n_heads=8, n_kv_heads=2, hidden=768, max_seq=512)

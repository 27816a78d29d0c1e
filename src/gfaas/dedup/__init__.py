"""Page merging of warm functions' memory (UPM's contract on Linux as it is; docs/dedup.md).

* :func:`merge` (``ctx.merge`` in a handler) marks the whole pages of an object mergeable; the node
  daemon's :class:`~gfaas.dedup.controller.MergeController` merges them with identical pages of its
  sharing domain by a short KSM burst, then restores KSM's settings.
* :func:`track_regions` finds the memory a library allocated by itself (a model load), for
  :func:`merge_regions`.
* :func:`load_shared` maps a file's content read-only from a content-addressed store, so every
  process of a domain that loads identical bytes shares one copy at once; :func:`remap_shared` does
  the same for a big buffer already in memory.

``import gfaas.dedup`` loads the hint and store modules only: neither onnxruntime (``gfaas.dedup.ort``)
nor the controller (``gfaas.dedup.controller``, the node daemon's) comes with it.
"""

from __future__ import annotations

from .hint import Hint, merge, merge_regions, take_hinted
from .regions import track_regions
from .remap import remap_shared
from .shared import SharedBuffer, clear_store, load_shared, publish_bytes

__all__ = ["Hint", "SharedBuffer", "clear_store", "load_shared", "merge", "merge_regions", "publish_bytes",
           "remap_shared", "take_hinted", "track_regions"]

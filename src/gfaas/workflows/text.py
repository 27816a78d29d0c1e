"""Text for the social and yelp workflows: a 5x7 bitmap font, a renderer, a projection-profile OCR
that reads the renderer's output back exactly, and a character-level tokenizer for BERT.

OCR works on dark pixels (grey level below :data:`DARK`): rows with dark pixels form text lines,
columns with dark pixels inside a line form glyphs (every glyph of the font has contiguous inked
columns and all glyphs are separated by at least one blank column), each glyph is sampled at the
centres of its font cells and matched against the font, and the gap to the next glyph, less the
blank columns the two glyphs carry, gives the number of spaces between them. The rendering scale is
inferred from a line's height, so every line must hold at least one letter or digit (the glyphs that
span all seven rows); punctuation-only lines are not supported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

DARK = 128  # grey level below which a pixel is ink

# 5 columns x 7 rows; '#' is ink. Letters and digits span all 7 rows, so a line that holds one of
# them is exactly 7 cells tall, which is how OCR infers the rendering scale.
_FONT_ROWS: dict[str, tuple[str, ...]] = {
    "A": (" ### ", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"),
    "B": ("#### ", "#   #", "#   #", "#### ", "#   #", "#   #", "#### "),
    "C": (" ### ", "#   #", "#    ", "#    ", "#    ", "#   #", " ### "),
    "D": ("#### ", "#   #", "#   #", "#   #", "#   #", "#   #", "#### "),
    "E": ("#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#####"),
    "F": ("#####", "#    ", "#    ", "#### ", "#    ", "#    ", "#    "),
    "G": (" ### ", "#   #", "#    ", "# ###", "#   #", "#   #", " ####"),
    "H": ("#   #", "#   #", "#   #", "#####", "#   #", "#   #", "#   #"),
    "I": (" ### ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "),
    "J": ("  ###", "   # ", "   # ", "   # ", "   # ", "#  # ", " ##  "),
    "K": ("#   #", "#  # ", "# #  ", "##   ", "# #  ", "#  # ", "#   #"),
    "L": ("#    ", "#    ", "#    ", "#    ", "#    ", "#    ", "#####"),
    "M": ("#   #", "## ##", "# # #", "# # #", "#   #", "#   #", "#   #"),
    "N": ("#   #", "#   #", "##  #", "# # #", "#  ##", "#   #", "#   #"),
    "O": (" ### ", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "),
    "P": ("#### ", "#   #", "#   #", "#### ", "#    ", "#    ", "#    "),
    "Q": (" ### ", "#   #", "#   #", "#   #", "# # #", "#  # ", " ## #"),
    "R": ("#### ", "#   #", "#   #", "#### ", "# #  ", "#  # ", "#   #"),
    "S": (" ####", "#    ", "#    ", " ### ", "    #", "    #", "#### "),
    "T": ("#####", "  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "  #  "),
    "U": ("#   #", "#   #", "#   #", "#   #", "#   #", "#   #", " ### "),
    "V": ("#   #", "#   #", "#   #", "#   #", "#   #", " # # ", "  #  "),
    "W": ("#   #", "#   #", "#   #", "# # #", "# # #", "# # #", " # # "),
    "X": ("#   #", "#   #", " # # ", "  #  ", " # # ", "#   #", "#   #"),
    "Y": ("#   #", "#   #", " # # ", "  #  ", "  #  ", "  #  ", "  #  "),
    "Z": ("#####", "    #", "   # ", "  #  ", " #   ", "#    ", "#####"),
    "0": (" ### ", "#   #", "#  ##", "# # #", "##  #", "#   #", " ### "),
    "1": ("  #  ", " ##  ", "  #  ", "  #  ", "  #  ", "  #  ", " ### "),
    "2": (" ### ", "#   #", "    #", "   # ", "  #  ", " #   ", "#####"),
    "3": ("#####", "   # ", "  #  ", "   # ", "    #", "#   #", " ### "),
    "4": ("   # ", "  ## ", " # # ", "#  # ", "#####", "   # ", "   # "),
    "5": ("#####", "#    ", "#### ", "    #", "    #", "#   #", " ### "),
    "6": ("  ## ", " #   ", "#    ", "#### ", "#   #", "#   #", " ### "),
    "7": ("#####", "    #", "   # ", "  #  ", " #   ", " #   ", " #   "),
    "8": (" ### ", "#   #", "#   #", " ### ", "#   #", "#   #", " ### "),
    "9": (" ### ", "#   #", "#   #", " ####", "    #", "   # ", " ##  "),
    ".": ("     ", "     ", "     ", "     ", "     ", " ##  ", " ##  "),
    ",": ("     ", "     ", "     ", "     ", " ##  ", "  #  ", " #   "),
    "!": ("  #  ", "  #  ", "  #  ", "  #  ", "  #  ", "     ", "  #  "),
    "?": (" ### ", "#   #", "    #", "   # ", "  #  ", "     ", "  #  "),
    "'": ("  #  ", "  #  ", " #   ", "     ", "     ", "     ", "     "),
    "-": ("     ", "     ", "     ", "#####", "     ", "     ", "     "),
}
GLYPH_H, GLYPH_W, ADVANCE = 7, 5, 6  # cell size and horizontal advance (one blank column) in font units
CHARSET = "".join(_FONT_ROWS) + " "
UNKNOWN = "\ufffd"  # what OCR returns for an ink blob that matches no glyph


@dataclass(frozen=True)
class Glyph:
    char: str
    bitmap: np.ndarray  # bool [7, 5]
    left: int           # blank columns on the left
    right: int          # blank columns on the right

    @property
    def ink(self) -> np.ndarray:
        """The bitmap without its blank side columns."""
        return self.bitmap[:, self.left:GLYPH_W - self.right]


@lru_cache(maxsize=1)
def font() -> dict[str, Glyph]:
    """The font as :class:`Glyph` records (space has no ink and is not listed)."""
    out = {}
    for ch, rows in _FONT_ROWS.items():
        bm = np.array([[c == "#" for c in row] for row in rows], dtype=bool)
        cols = np.flatnonzero(bm.any(axis=0))
        out[ch] = Glyph(ch, bm, int(cols[0]), GLYPH_W - 1 - int(cols[-1]))
    return out


# ---- rendering --------------------------------------------------------------------------------------
def wrap(text: str, per_line: int) -> list[str]:
    """Greedy word wrap to at most ``per_line`` characters (words are never split)."""
    lines: list[str] = []
    cur = ""
    for word in text.split():
        if len(word) > per_line:
            raise ValueError(f"word {word!r} is longer than a line ({per_line} characters)")
        if cur and len(cur) + 1 + len(word) > per_line:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur} {word}" if cur else word
    if cur:
        lines.append(cur)
    return lines


@dataclass(frozen=True)
class Rendered:
    image: np.ndarray                           # uint8 [H, W, 3]
    lines: tuple[str, ...]                      # the text of each rendered line
    boxes: tuple[tuple[int, int, int, int], ...]  # tight ink box of each line: (y0, x0, y1, x1), end exclusive


def render(text: str, hw: tuple[int, int], scale: int, margin: int, rng: np.random.Generator | None = None,
           line_gap: int = 3) -> Rendered:
    """Draw ``text`` (characters of :data:`CHARSET`) word-wrapped in dark ink on a pale, slightly
    noisy, decorated background. Each font cell is ``scale`` x ``scale`` pixels; lines are
    ``line_gap`` cells apart. The noise never crosses the ink threshold."""
    bad = sorted(set(text) - set(CHARSET))
    if bad:
        raise ValueError(f"cannot render characters {bad}; the font has {CHARSET!r}")
    h, w = hw
    per_line = (w - 2 * margin + scale) // (ADVANCE * scale)
    lines = wrap(text, per_line)
    pitch = (GLYPH_H + line_gap) * scale
    if margin + len(lines) * pitch - line_gap * scale > h - margin:
        raise ValueError(f"{len(lines)} lines of text do not fit a {h}x{w} image at scale {scale}")
    ink = np.zeros((h, w), dtype=bool)
    glyphs = font()
    cell = np.ones((scale, scale), dtype=bool)
    for i, line in enumerate(lines):
        y = margin + i * pitch
        for j, ch in enumerate(line):
            if ch == " ":
                continue
            x = margin + j * ADVANCE * scale
            ink[y:y + GLYPH_H * scale, x:x + GLYPH_W * scale] |= np.kron(glyphs[ch].bitmap, cell)
    boxes = []
    for i in range(len(lines)):
        y = margin + i * pitch
        band = ink[y:y + GLYPH_H * scale]
        rows, cols = np.flatnonzero(band.any(axis=1)), np.flatnonzero(band.any(axis=0))
        boxes.append((y + int(rows[0]), int(cols[0]), y + int(rows[-1]) + 1, int(cols[-1]) + 1))
    rng = rng if rng is not None else np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    paper = np.stack([236 - 10 * yy / h, 232 - 6 * xx / w, 222 + 0 * xx], axis=-1).astype(np.float32)
    paper[(yy // max(h // 8, 1)) % 2 == 1] -= np.array([0, 10, 25], dtype=np.float32)  # pale stripes
    img = np.where(ink[..., None], np.float32(30), paper)
    img += rng.uniform(-15, 15, size=img.shape).astype(np.float32)
    return Rendered(np.clip(np.rint(img), 0, 255).astype(np.uint8), tuple(lines), tuple(boxes))


# ---- OCR --------------------------------------------------------------------------------------------
def ink_mask(image: np.ndarray) -> np.ndarray:
    """Pixels darker than :data:`DARK` (mean of the channels for a colour image)."""
    a = np.asarray(image)
    grey = a.mean(axis=-1) if a.ndim == 3 else a.astype(np.float32)
    return grey < DARK


def _runs(mask: Any) -> list[tuple[int, int]]:
    """Maximal runs of True in a 1-D mask as (start, end) with end exclusive."""
    m = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]])
    edges = np.flatnonzero(m[1:] != m[:-1])
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def detect_lines(ink: np.ndarray) -> list[tuple[int, int, int, int]]:
    """Text line boxes ``(y0, x0, y1, x1)`` (end exclusive) by projection profiles: maximal runs of rows
    that hold ink, each narrowed to the columns that hold ink in it."""
    boxes = []
    for y0, y1 in _runs(ink.any(axis=1)):
        cols = np.flatnonzero(ink[y0:y1].any(axis=0))
        boxes.append((y0, int(cols[0]), y1, int(cols[-1]) + 1))
    return boxes


def read_line(ink: np.ndarray, box: tuple[int, int, int, int]) -> str:
    """The text of one line box: glyphs from column runs, matched against the font at the scale the
    line's height implies (7 cells), spaces from the gaps between glyphs."""
    y0, x0, y1, x1 = box
    band = ink[y0:y1, x0:x1]
    scale = max((y1 - y0) // GLYPH_H, 1)
    rows = np.minimum(np.arange(GLYPH_H) * scale + scale // 2, band.shape[0] - 1)
    glyphs = font()
    out: list[str] = []
    prev_end, prev_right = None, 0
    for c0, c1 in _runs(band.any(axis=0)):
        width = max(int(round((c1 - c0) / scale)), 1)
        cols = np.minimum(c0 + np.arange(width) * scale + scale // 2, band.shape[1] - 1)
        sample = band[np.ix_(rows, cols)]
        best, best_d = None, None
        for g in glyphs.values():
            if g.ink.shape[1] != width:
                continue
            d = int(np.count_nonzero(g.ink != sample))
            if best_d is None or d < best_d:
                best, best_d = g, d
        left = best.left if best is not None else 0
        if prev_end is not None:
            gap = (c0 - prev_end) / scale
            out.append(" " * max(int(round((gap - 1 - prev_right - left) / ADVANCE)), 0))
        out.append(best.char if best is not None else UNKNOWN)
        prev_end, prev_right = c1, (best.right if best is not None else 0)
    return "".join(out)


def ocr(image: np.ndarray) -> tuple[str, list[tuple[int, int, int, int]]]:
    """Read all text of an image: ``(text, line boxes)``; lines are joined with single spaces."""
    ink = ink_mask(image)
    boxes = detect_lines(ink)
    return " ".join(read_line(ink, b) for b in boxes), boxes


# ---- tokenizer --------------------------------------------------------------------------------------
PAD, UNK, CLS, SEP = 0, 1, 2, 3
_FIRST, _LAST = 32, 126  # printable ASCII
_OFFSET = 4
VOCAB_NEEDED = _OFFSET + _LAST - _FIRST + 1  # 99: the smallest BERT vocabulary these ids fit


def encode(text: str) -> np.ndarray:
    """Character-level token ids (int64): printable ASCII ``c`` -> ``4 + ord(c) - 32``, anything else
    -> :data:`UNK`. No special tokens are added."""
    return np.array([_OFFSET + ord(c) - _FIRST if _FIRST <= ord(c) <= _LAST else UNK for c in text], dtype=np.int64)


def decode(ids: Sequence[int] | np.ndarray) -> str:
    """Inverse of :func:`encode` for printable ASCII; special tokens are dropped, UNK reads as U+FFFD."""
    out = []
    for i in np.asarray(ids, dtype=np.int64).tolist():
        if i in (PAD, CLS, SEP):
            continue
        out.append(chr(i - _OFFSET + _FIRST) if _OFFSET <= i <= _OFFSET + _LAST - _FIRST else UNKNOWN)
    return "".join(out)


def bert_batch(rows: Sequence[np.ndarray], seq_len: int | None) -> tuple[np.ndarray, np.ndarray]:
    """``[CLS] tokens [SEP]`` per row, truncated to and padded to ``seq_len`` (or to the longest row when
    ``seq_len`` is None): ``(input_ids, attention_mask)``, both int64 ``[len(rows), L]``."""
    length = seq_len if seq_len is not None else max((len(r) + 2 for r in rows), default=2)
    if length < 2:
        raise ValueError(f"sequence length {length} cannot hold [CLS] and [SEP]")
    ids = np.full((len(rows), length), PAD, dtype=np.int64)
    mask = np.zeros((len(rows), length), dtype=np.int64)
    for i, r in enumerate(rows):
        body = np.asarray(r, dtype=np.int64)[:length - 2]
        n = len(body) + 2
        ids[i, :n] = np.concatenate([[CLS], body, [SEP]])
        mask[i, :n] = 1
    return ids, mask


def model_seq_len(model: object, fallback: int | None = None) -> int | None:
    """The fixed sequence length of a BERT model's ``input_ids`` (None or ``fallback`` when dynamic)."""
    shape = model.info.inputs["input_ids"][0]  # type: ignore[attr-defined]
    n = shape[-1]
    return int(n) if isinstance(n, int) and n > 0 else fallback


def check_vocab(model: object, ids: np.ndarray) -> None:
    """Raise if a token id does not fit the model's vocabulary."""
    vocab = int(getattr(model.info, "vocab_size", 0) or 0)  # type: ignore[attr-defined]
    if vocab and ids.size and int(ids.max()) >= vocab:
        raise ValueError(f"token id {int(ids.max())} is outside the model's vocabulary of {vocab}; "
                         f"the character tokenizer needs at least {VOCAB_NEEDED}")

"""Social media (condition): OCR a posted image, then BERT sentiment on its text, only when there is
text (``when: ocr.num_tokens > 0``)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..runtime.context import Context
from ._util import run_model
from .imaging import softmax
from .scenes import FULL_HW, SMALL_HW, check_scale
from .text import bert_batch, check_vocab, encode, model_seq_len, ocr, render

SPEC = "social"

# Post captions, rendered with the 5x7 font (upper case, digits and . , ! ? ' -).
CORPUS = (
    "GREAT COFFEE TODAY!",
    "THE BUS WAS LATE AGAIN.",
    "NEW PARK OPENS AT 9.",
    "WHO WANTS PIZZA?",
    "RAIN ALL WEEK, SO SAD.",
    "BEST CONCERT EVER!",
    "TRAFFIC ON MAIN ST IS BAD.",
    "HAPPY 30TH BIRTHDAY, SAM!",
    "LOST MY KEYS - AGAIN.",
    "IT'S A SUNNY DAY.",
    "THIS CAKE IS 10 OUT OF 10.",
    "MONDAY MORNING BLUES.",
)
# (image size, font scale in pixels per font cell, margin, sentences per post) per scale
LAYOUT = {"small": (SMALL_HW, 1, 4, 2), "full": (FULL_HW, 8, 60, 6)}


def read(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Find text lines by projection profiles, read their glyphs, tokenize the text."""
    text, boxes = ocr(ctx.get(inputs["image"]))
    tokens = encode(text)
    return {
        "tokens": tokens,
        "num_tokens": np.int64(len(tokens)),
        "text": np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8).copy(),
        "boxes": np.asarray(boxes, dtype=np.int64).reshape(-1, 4),
    }


def sentiment(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """BERT over ``[CLS] tokens [SEP]``: the two sentiment logits and their softmax."""
    tokens = ctx.get(inputs["tokens"])
    ids, mask = bert_batch([tokens], model_seq_len(ctx.model))
    check_vocab(ctx.model, ids)
    logits = np.asarray(run_model(ctx.model, input_ids=ids, attention_mask=mask)["logits"][0], dtype=np.float32)
    return {"logits": logits, "probs": softmax(logits)}


def post_text(seed: int, sentences: int) -> str:
    rng = np.random.default_rng([seed, 5])
    return " ".join(CORPUS[i] for i in rng.choice(len(CORPUS), size=sentences, replace=False))


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """An image of a post's caption: uint8 ``[H, W, 3]`` (1080p at full scale, 96x128 at small) with
    sentences from :data:`CORPUS` chosen by ``seed``, rendered dark on a pale striped background."""
    hw, font_scale, margin, n = LAYOUT[check_scale(scale)]
    r = render(post_text(seed, n), hw, font_scale, margin, np.random.default_rng([seed, 6]))
    return {"image": r.image}

"""Review analysis (sequence): BERT spam filter -> BERT sentiment.

The first function tokenizes the review sentence by sentence, scores each sentence as spam and passes
the token rows of the sentences it keeps to the second, which scores their sentiment.

The zoo's BERT has random weights and gives every sentence about the same spam probability, so a
sentence is dropped when the model's probability reaches the threshold *and* the sentence carries an
advertising marker (a link, "click", "free", ...): the model still votes, and the synthetic reviews'
planted advertising sentence is what gets filtered.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..runtime.context import Context
from ._util import run_model
from .imaging import softmax
from .scenes import check_scale
from .text import bert_batch, check_vocab, encode, model_seq_len

SPEC = "yelp"

OPENERS = ("The", "Our", "My", "This")
SUBJECTS = ("pasta", "service", "waiter", "pizza", "dessert", "coffee", "staff", "patio", "burger", "soup")
VERDICTS = ("was amazing", "was cold", "took forever", "was perfect", "felt overpriced", "was friendly",
            "was bland", "made our night", "was too salty", "exceeded expectations")
ENDINGS = (".", "!", ".", "...")
SPAM = ("Click here for FREE coupons at www.deals4u.example!", "Buy cheap followers now, limited offer!")
SENTENCES = {"small": 4, "full": 5}
AD_MARKERS = ("www.", "http", "click", "free", "buy ", "offer", "coupon")


def has_ad_marker(sentence: str) -> bool:
    low = sentence.lower()
    return any(m in low for m in AD_MARKERS)


def sentences(text: str) -> list[str]:
    """Split after ``.``, ``!`` or ``?`` runs followed by white space; empty pieces are dropped."""
    return [s for s in (p.strip() for p in re.split(r"(?<=[.!?])\s+", text)) if s]


def filter_spam(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """Tokenize each sentence, score it with BERT (probability of class 1 = spam) and drop the
    sentences whose probability reaches ``params.spam_threshold`` (default 0.5) and that carry an
    advertising marker; pass the token rows of the others on."""
    text = ctx.get(inputs["review"]).tobytes().decode("ascii", errors="replace")
    parts = sentences(text)
    rows = [encode(s) for s in parts]
    ids, mask = bert_batch(rows, model_seq_len(ctx.model))
    check_vocab(ctx.model, ids)
    if rows:
        spam = softmax(run_model(ctx.model, input_ids=ids, attention_mask=mask)["logits"])[:, 1]
    else:
        spam = np.zeros(0, dtype=np.float32)
    ads = np.array([has_ad_marker(s) for s in parts], dtype=bool)
    keep = ~((spam >= float(ctx.params.get("spam_threshold", 0.5))) & ads)
    return {"input_ids": ids[keep], "attention_mask": mask[keep], "spam_prob": spam.astype(np.float32),
            "num_kept": np.int64(np.count_nonzero(keep))}


def score_sentiment(ctx: Context, inputs: dict[str, Any]) -> dict[str, Any]:
    """BERT sentiment of the kept sentences; ``positive`` is the mean probability of class 1 (0.5, no
    opinion, when every sentence was filtered out)."""
    ids = ctx.get(inputs["input_ids"], device=True)  # on a GPU the node delivers them there
    mask = ctx.get(inputs["attention_mask"], device=True)
    if len(ids) == 0:
        return {"logits": np.zeros((0, 2), dtype=np.float32), "positive": np.float32(0.5)}
    logits = np.asarray(run_model(ctx.model, input_ids=ids, attention_mask=mask)["logits"], dtype=np.float32)
    return {"logits": logits, "positive": np.float32(softmax(logits)[:, 1].mean())}


def review_text(seed: int, n: int) -> str:
    """``n`` sentences built from the fixed word lists, with one spam sentence somewhere for n >= 4."""
    rng = np.random.default_rng([seed, 7])
    out = [f"{OPENERS[rng.integers(len(OPENERS))]} {SUBJECTS[rng.integers(len(SUBJECTS))]} "
           f"{VERDICTS[rng.integers(len(VERDICTS))]}{ENDINGS[rng.integers(len(ENDINGS))]}" for _ in range(n)]
    if n >= 4:
        out[int(rng.integers(n))] = SPAM[int(rng.integers(len(SPAM)))]
    return " ".join(out)


def make_inputs(seed: int = 0, scale: str = "small") -> dict[str, np.ndarray]:
    """A review as ASCII bytes: uint8 ``[n]``, 4 sentences at small scale, 5 at full (a short
    review: each sentence costs two BERT-base passes, ~0.25 s each on one core)."""
    text = review_text(seed, SENTENCES[check_scale(scale)])
    return {"review": np.frombuffer(text.encode("ascii"), dtype=np.uint8).copy()}

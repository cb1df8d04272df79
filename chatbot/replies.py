"""From reply ids to what a user reads: trimmed ids, replies cut out of a runaway loop, a streamed reply's
growing text, and where a reply came from.

Owns: `runaway_cut`, `trim`, `streamed_text`, `revealed` and `Provenance` (the training answers a reply may
be a copy of). Must not decode: ids come from `chatbot.decoding`, through `chatbot.generate.Chatbot`.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np
import tensorflow as tf

from chatbot.text import conversation
from chatbot.tokenizer import END_ID, PAD_ID, Tokenizer


def runaway_cut(ids: list[int], copies: int = 3) -> int | None:
    """Where to cut a reply that ran to its length limit without an end token while repeating itself
    ("있어요 있어요 있어요 ..."): after the first of the `copies` or more repeats of a block of 1-8 tokens at its
    end. None for a reply that ended (or is padded) or does not end in such a loop."""
    if not ids or END_ID in ids or PAD_ID in ids:
        return None
    for period in range(1, 9):
        repeats = 1
        while (repeats + 1) * period <= len(ids) and \
                ids[len(ids) - (repeats + 1) * period:len(ids) - repeats * period] == ids[len(ids) - period:]:
            repeats += 1
        if repeats >= copies:
            return len(ids) - (repeats - 1) * period
    return None


def trim(ids) -> list[list[int]]:
    """Cut each row of reply ids at its end token."""
    rows = []
    for row in np.asarray(ids).tolist():
        rows.append(row[:row.index(END_ID)] if END_ID in row else [t for t in row if t != PAD_ID])
    return rows


def streamed_text(tokenizer: Tokenizer, tokens: Iterable[int], max_length: int) -> Iterator[str]:
    """The growing reply as its tokens arrive, each time its text changes ("" for an empty reply). A reply
    that ran to `max_length` in a loop ends as `runaway_cut` cuts it: what `Chatbot.reply` gives."""
    pieces, previous, ids = [], "", []
    for token in tokens:
        ids.append(token)
        cut = runaway_cut(ids) if len(ids) == max_length else None
        if cut is not None:
            yield tokenizer.decode([ids[:cut]])[0]
            return
        pieces.append(tokenizer.piece_text(token))
        current = tokenizer.join_pieces(pieces)  # only the new piece is looked up, never the prefix
        if current != previous:
            previous = current
            yield current
    if not previous:
        yield ""


def revealed(tokenizer: Tokenizer, ids: list[int]) -> Iterator[str]:
    """A finished reply's ids (trimmed) shown as if streamed: one more piece each time."""
    pieces = [tokenizer.piece_text(i) for i in ids]
    for end in range(1, len(pieces) + 1):
        yield tokenizer.join_pieces(pieces[:end])


class Provenance:
    """`provenance(text, reply)` against one retrieval index; its table of training answers is built on
    first use."""

    def __init__(self, retriever):
        self.retriever = retriever
        self._answer_rows = None  # training answer -> its rows in the retrieval index

    def __call__(self, text: str, reply: str) -> dict:
        """`reply`; `copied`: whether it is exactly a training answer; `source_question`: then the training
        question with that answer nearest to `text`; `nearest_question`: the training question nearest to
        `text` (what retrieval would answer with its answer); `fallback`: whether the reply is the fallback, as no
        training question was close enough. A learner sees what the model wrote itself."""
        result = {"reply": reply, "copied": False, "source_question": None, "nearest_question": None,
                  "fallback": False}
        if self.retriever is None:
            return result
        if self._answer_rows is None:
            self._answer_rows = {}
            for row, pair in enumerate(self.retriever.pairs):
                self._answer_rows.setdefault(pair.answer, []).append(row)
        similarity = self.retriever.similarity(tf.constant([text]))[0].numpy()
        result["nearest_question"] = conversation(self.retriever.pairs[int(similarity.argmax())].question)
        config = self.retriever.config
        result["fallback"] = bool(reply == config.fallback and similarity.max() < config.threshold)
        rows = self._answer_rows.get(reply)
        if rows:
            best = max(rows, key=lambda row: similarity[row])
            result.update(copied=True, source_question=conversation(self.retriever.pairs[best].question))
        return result

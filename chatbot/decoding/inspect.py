"""Inspecting a reply: where it came from (`Provenance`) and what its tokens attended to (`attention`).

Owns: `Provenance` (whether a reply is exactly a training answer, and which question it answered) and `attention`
(a reply's cross-attention over the encoder input, for the app's heatmap and the notebook). Must not decode a
reply of its own: both read the reply they are given.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chatbot.data.text import conversation
from chatbot.tokenizer.subword import END_ID, START_ID


class Provenance:
    """`provenance(text, reply)` against one retrieval index; its table of training answers is built on first use."""

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


def attention(model, tokenizer, encoder_ids, reply_ids) -> dict:
    """Cross-attention of a reply (ids, without start or end) over one encoder input (1, src_len): its tokens and
    weights (layers, heads, reply + 1, encoder input)."""
    reply_ids = list(reply_ids)[:model.max_length - 1]  # the start token and the reply share the positions
    decoder_ids = tf.constant([[START_ID, *reply_ids]], tf.int32)
    memory = model.encode(encoder_ids, training=False)
    _, weights = model.decode(decoder_ids, memory, encoder_ids, return_attention=True)
    return {"reply": tokenizer.decode([reply_ids])[0],
            "question_tokens": tokenizer.pieces(encoder_ids[0].numpy()),
            "reply_tokens": tokenizer.pieces([*reply_ids, END_ID]),
            "weights": np.stack([w[0].numpy() for w in weights])}

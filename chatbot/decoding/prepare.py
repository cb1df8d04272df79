"""Prepare: the request's strings as the loop reads them, in a plain graph (XLA compiles no string ops).

Owns: `Preparer` (texts and tones -> `Prepared`: the encoder ids composed as training composes them, padded to a
length bucket; the retrieved answers a rerank weighs; whether any training question is close enough). Must not
run the decoder.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from chatbot.config import ChatbotConfig
from chatbot.model.inputs import bucket, compose_encoder_inputs
from chatbot.tokenizer.subword import END_ID, Tokenizer


class Prepared(NamedTuple):
    """What `Preparer` hands the compiled loop, one row per question."""

    encoder_ids: tf.Tensor  # (batch, src_len), padded with 0 to a length bucket
    retrieved: tf.Tensor  # (batch, candidates, max_length): retrieved answers as reply ids, ended by END_ID
    scores: tf.Tensor  # (batch, candidates): their retrieval scores
    confident: tf.Tensor  # (batch,) float32: 1 where a training question is close enough (else the fallback)


class Preparer:
    """Strings (batch,) and tones (batch,) -> `Prepared`, for one model and its retrieval index (None: none)."""

    def __init__(self, tokenizer: Tokenizer, config: ChatbotConfig, retriever, max_length: int, encoder_length: int):
        self.tokenizer, self.config, self.retriever, self.max_length = tokenizer, config, retriever, max_length
        self.context = config.context
        # A question alone fits in 16 tokens, most with a retrieved answer in 32, with two retrieved pairs and
        # their questions in 64 or 96. Each length and batch bucket costs one XLA compilation (seconds on a CPU).
        self.length_buckets = tuple(b for b in (16, 32, 64, 96) if b < encoder_length) + (encoder_length,)

    def __call__(self, texts, tones, candidates: int, min_length=0) -> Prepared:
        """Encoder ids padded to a length bucket, at least `min_length`: XLA compiles the loop per bucket, not per
        question. One similarity matrix serves both retrieval lookups."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self.tones(texts, tones)
        similarity = self.retriever.similarity(texts) if self.context.retrieved or candidates else None
        ids = self.encoder_ids(texts, tones, similarity).to_tensor()
        width = tf.shape(ids)[1]
        ids = tf.pad(ids, [[0, 0], [0, bucket(tf.maximum(width, min_length), self.length_buckets) - width]])
        confident = (tf.ones(tf.shape(texts), tf.float32) if similarity is None
                     else tf.cast(self.retriever.confident(texts, similarity), tf.float32))
        return Prepared(ids, *self.retrieved(texts, tones, candidates, similarity), confident)

    def encoder_ids(self, texts, tones=None, similarity=None) -> tf.RaggedTensor:
        """Strings (batch,) -> encoder ids (batch, None), unpadded, composed by `compose_encoder_inputs` as training
        composes them; the retrieved neighbours come from the index (`similarity`: the questions'
        `Retriever.similarity`, if at hand)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self.tones(texts, tones)
        asked = answers = None
        if self.context.retrieved:
            asked, answers = self.retriever.neighbours(texts, self.context.retrieved, tones, similarity=similarity)
        return compose_encoder_inputs(self.tokenizer.tokenize, texts, tones, self.config, answers, asked)

    def tones(self, texts, tones):
        """The tones (batch,) int the graph uses: as asked, or -1 (none) when none was asked or none learned."""
        return tf.fill(tf.shape(texts), -1) if tones is None or not self.context.tone else tones

    def retrieved(self, texts, tones, count: int, similarity):
        """`Prepared.retrieved` and `Prepared.scores`: the answers of the `count` nearest training questions."""
        if not count:
            return tf.zeros([tf.shape(texts)[0], 0, self.max_length], tf.int32), tf.zeros([tf.shape(texts)[0], 0])
        # a reply asked for in a tone is weighed against that tone's answers only
        answers, scores = self.retriever.ranked(texts, count, tones, only_tone=True, similarity=similarity)
        ids = self.tokenizer.tokenize(tf.reshape(answers, [-1]))[:, :self.max_length - 1]
        ids = tf.concat([ids, tf.fill([ids.nrows(), 1], tf.constant(END_ID, ids.dtype))], axis=1)
        ids = tf.cast(ids.to_tensor(shape=[None, self.max_length]), tf.int32)
        return tf.reshape(ids, [-1, count, self.max_length]), scores

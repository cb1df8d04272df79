"""Reranking: the generated reply weighed against the answers of the nearest training questions.

Generate, then rerank generated and retrieved replies (Song et al. 2016). Owns, in the graph: each
candidate's `Features` (the model's mean log-probability of it, teacher-forced in one decoder pass;
its question's retrieval score; its word-piece overlap with the other retrieved answers, weighted by
their scores: a consensus vote) and `choose`, their weighted sum's best candidate. The weights are a
model's `RerankConfig`, fitted on its validation questions by `chatbot.evaluate.fit_rerank_weights`.
Must not know about strings or the decoding loop.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from chatbot.config import RerankConfig
from chatbot.layers import padding_mask
from chatbot.samplers import NEG_INF
from chatbot.tokenizer import NUM_SPECIAL, PAD_ID, START_ID

RERANK_WIDTH = 16  # reply tokens the teacher-forced pass reads (see `mean_log_likelihood`)


class Features(NamedTuple):
    """What `choose` weighs, for each question's generated reply and its k retrieved answers."""

    candidates: tf.Tensor  # (batch, 1 + k, max_length) ids: the generated reply first
    likelihood: tf.Tensor  # (batch, 1 + k) mean log-probability per token under the model
    similarity: tf.Tensor  # (batch, 1 + k) retrieval score of the answer's question; 0 for the generated reply
    consensus: tf.Tensor  # (batch, 1 + k) overlap with the other retrieved answers, weighted by their scores
    allowed: tf.Tensor  # (batch, 1 + k) bool: the generated reply, and retrieved answers within the step limit


def features(model, encoder_ids, memory, replies, retrieved, scores, steps, likelihood: bool = True) -> Features:
    """Generated replies (batch, max_length), retrieved answers (batch, k, max_length) with their retrieval
    scores (batch, k), and the encoder input and output they answer -> `Features`. A retrieved answer
    longer than `steps` tokens is not allowed. `likelihood=False` leaves the likelihoods at 0 and skips
    their decoder pass, most of a batched reply's cost: for weights that give them no weight."""
    candidates = tf.concat([replies[:, None], retrieved], axis=1)
    count, k = candidates.shape[1], retrieved.shape[1]
    if likelihood:
        likelihood = mean_log_likelihood(model, tf.reshape(candidates, [-1, candidates.shape[2]]),
                                         tf.repeat(memory, count, axis=0), tf.repeat(encoder_ids, count, axis=0))
    else:
        likelihood = tf.zeros([tf.shape(candidates)[0] * count])
    weights = tf.maximum(scores, 0.0)[:, None, :] * tf.cast(
        ~tf.concat([tf.zeros([1, k], tf.bool), tf.eye(k, dtype=tf.bool)], axis=0), tf.float32)[None]
    consensus = (tf.reduce_sum(weights * token_f1(candidates, retrieved), axis=-1)
                 / tf.maximum(tf.reduce_sum(weights, axis=-1), 1e-9))  # (batch, 1 + k), itself left out
    fits = tf.reduce_sum(tf.cast(candidates >= NUM_SPECIAL, tf.int32), axis=-1) <= steps
    return Features(candidates, tf.reshape(likelihood, [-1, count]),
                    tf.concat([tf.zeros_like(scores[:, :1]), scores], axis=1), consensus,
                    fits | (tf.range(count) == 0)[None])


def choose(found: Features, weights: RerankConfig):
    """Each question's best candidate (batch, max_length) by the weighted sum of its features."""
    return tf.gather(found.candidates, choice(found, weights), batch_dims=1)


def choice(found: Features, weights: RerankConfig):
    """The index (batch,) int32 of each question's best allowed candidate."""
    total = (weights.likelihood * found.likelihood + weights.similarity * found.similarity
             + weights.consensus * found.consensus)
    return tf.argmax(tf.where(found.allowed, total, NEG_INF), axis=-1, output_type=tf.int32)


def mean_log_likelihood(model, replies, memory, encoder_ids):
    """The model's mean log-probability per token of each reply (rows, max_length), teacher-forced in
    one decoder pass: (rows,). The pass reads the first RERANK_WIDTH tokens only: its cost grows with
    its width, nearly every answer ends within them (98% of the default model's training answers, and
    cutting 24 to 16 changed no choice among its 1,473 held-out questions' candidates), and a longer
    one is judged by its beginning."""
    ids = replies[:, :min(RERANK_WIDTH, replies.shape[1])]
    inputs = tf.concat([tf.fill([tf.shape(ids)[0], 1], START_ID), ids[:, :-1]], axis=1)
    logits = model.decode(inputs, memory, padding_mask(encoder_ids), training=False)
    log_probs = tf.gather(tf.nn.log_softmax(tf.cast(logits, tf.float32)), ids, axis=-1, batch_dims=2)
    real = tf.cast(ids != PAD_ID, tf.float32)
    return tf.reduce_sum(log_probs * real, -1) / tf.maximum(tf.reduce_sum(real, -1), 1.0)


def token_f1(a, b):
    """Word-piece overlap F1 of every row of `a` (batch, n, length) with every row of `b` (batch, m,
    length'), special tokens and padding ignored: (batch, n, m) in [0, 1]."""
    in_a, in_b = a >= NUM_SPECIAL, b >= NUM_SPECIAL
    same = ((a[:, :, None, :, None] == b[:, None, :, None, :])
            & in_a[:, :, None, :, None] & in_b[:, None, :, None, :])  # (batch, n, m, length, length')
    found = tf.reduce_sum(tf.cast(tf.reduce_any(same, axis=-1), tf.float32), axis=-1)  # a's tokens found in b
    recalled = tf.reduce_sum(tf.cast(tf.reduce_any(same, axis=-2), tf.float32), axis=-1)  # b's tokens found in a
    precision = found / tf.maximum(tf.reduce_sum(tf.cast(in_a, tf.float32), axis=-1), 1.0)[:, :, None]
    recall = recalled / tf.maximum(tf.reduce_sum(tf.cast(in_b, tf.float32), axis=-1), 1.0)[:, None, :]
    return 2 * precision * recall / tf.maximum(precision + recall, 1e-9)

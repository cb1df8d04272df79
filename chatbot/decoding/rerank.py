"""Reranking: the generated reply weighed against the answers of the nearest training questions.

Generate, then rerank generated and retrieved replies (Song et al. 2016). Owns, in the graph: each
candidate's `Features` (the model's mean log-probability of it, teacher-forced in one decoder pass
over a `shortlist`;
its question's retrieval score; its word-piece overlap with the other retrieved answers, weighted by
their scores: a consensus vote) and `choose`, their weighted sum's best candidate. The weights are a
model's `RerankConfig`, fitted on its validation questions by `chatbot.training.best_epoch.fit_rerank_weights`.
Also `agreement`, the overlap with the retrieved answers that beam search may add to a beam's score.
Must not know about strings or the decoding loop.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from chatbot.config import RerankConfig
from chatbot.model.layers import answer_positions
from chatbot.decoding.samplers import NEG_INF
from chatbot.tokenizer.subword import NUM_SPECIAL, PAD_ID, START_ID

RERANK_WIDTH = 12  # reply tokens the teacher-forced pass reads (see `mean_log_likelihood`)
SHORTLIST = 4  # retrieved answers whose likelihood the pass computes: the best by the other features (see `shortlist`)


class Features(NamedTuple):
    """What `choose` weighs, for each question's generated reply and its k retrieved answers."""

    candidates: tf.Tensor  # (batch, 1 + k, max_length) ids: the generated reply first
    likelihood: tf.Tensor  # (batch, 1 + k) mean log-probability per token under the model; 0 where not computed
    similarity: tf.Tensor  # (batch, 1 + k) retrieval score of the answer's question; 0 for the generated reply
    consensus: tf.Tensor  # (batch, 1 + k) overlap with the other retrieved answers, weighted by their scores
    allowed: tf.Tensor  # (batch, 1 + k) bool: the generated reply, and retrieved answers within the step limit


def features(model, encoder_ids, cross_cache, replies, retrieved, scores, steps, weights: RerankConfig | None = None
             ) -> Features:
    """Generated replies (batch, max_length), retrieved answers (batch, k, max_length) with their retrieval
    scores (batch, k), and the encoder input they answer with its output's keys and values
    (`Transformer.cross_cache`, projected once per question for the loop and this pass): `Features`. A retrieved answer
    longer than `steps` tokens is not allowed. The likelihood's decoder pass is most of a batched reply's
    cost: given the `weights` a reply is chosen by, it reads only their `shortlist`, and nothing when they
    give the likelihood no weight; `weights=None` computes it for every candidate (what fitting weighs)."""
    candidates = tf.concat([replies[:, None], retrieved], axis=1)
    count, k = candidates.shape[1], retrieved.shape[1]
    votes = tf.maximum(scores, 0.0)[:, None, :] * tf.cast(
        ~tf.concat([tf.zeros([1, k], tf.bool), tf.eye(k, dtype=tf.bool)], axis=0), tf.float32)[None]
    consensus = (tf.reduce_sum(votes * token_f1(candidates, retrieved), axis=-1)
                 / tf.maximum(tf.reduce_sum(votes, axis=-1), 1e-9))  # (batch, 1 + k), itself left out
    fits = tf.reduce_sum(tf.cast(candidates >= NUM_SPECIAL, tf.int32), axis=-1) <= steps
    found = Features(candidates, tf.zeros_like(consensus), tf.concat([tf.zeros_like(scores[:, :1]), scores], axis=1),
                     consensus, fits | (tf.range(count) == 0)[None])
    if weights is not None and weights.likelihood == 0:
        return found
    read = tf.broadcast_to(tf.range(count), tf.shape(consensus)) if weights is None else shortlist(found, weights)
    picked = tf.gather(candidates, read, batch_dims=1)  # (batch, rows read, max_length)
    rows = picked.shape[1]
    likelihood = mean_log_likelihood(model, tf.reshape(picked, [-1, picked.shape[2]]),
                                     tf.repeat(encoder_ids, rows, axis=0), tf.repeat(cross_cache, rows, axis=0))
    likelihood = tf.reduce_sum(tf.one_hot(read, count) * tf.reshape(likelihood, [-1, rows, 1]), axis=1)
    return found._replace(likelihood=likelihood)


def shortlist(found: Features, weights: RerankConfig):
    """The candidates (batch, 1 + min(SHORTLIST, k)) int32 that the choice is made among: the generated
    reply and the SHORTLIST allowed retrieved answers with the best weighted similarity and consensus.
    The likelihood weighs little against those two in fitted weights, so an answer outside them rarely
    wins, and the shortlist halves the likelihood pass (BENCHMARKS.md has the measurement)."""
    rest = weights.similarity * found.similarity[:, 1:] + weights.consensus * found.consensus[:, 1:]
    best = tf.math.top_k(tf.where(found.allowed[:, 1:], rest, NEG_INF), min(SHORTLIST, rest.shape[1])).indices
    return tf.concat([tf.zeros_like(best[:, :1]), best + 1], axis=1)


def choose(found: Features, weights: RerankConfig):
    """Each question's best candidate (batch, max_length) by the weighted sum of its features."""
    return tf.gather(found.candidates, choice(found, weights), batch_dims=1)


def choice(found: Features, weights: RerankConfig):
    """The index (batch,) int32 of each question's best allowed candidate on its `shortlist`."""
    total = (weights.likelihood * found.likelihood + weights.similarity * found.similarity
             + weights.consensus * found.consensus)
    listed = tf.reduce_max(tf.one_hot(shortlist(found, weights), tf.shape(total)[1]), axis=1) > 0
    return tf.argmax(tf.where(found.allowed & listed, total, NEG_INF), axis=-1, output_type=tf.int32)


def mean_log_likelihood(model, replies, encoder_ids, cross_cache):
    """The model's mean log-probability per token of each reply (rows, max_length), teacher-forced in
    one decoder pass over the encoder output whose ids and `Transformer.cross_cache` are given: (rows,).
    The pass reads the first RERANK_WIDTH tokens only: its cost grows with its width, most answers end
    within them (91% of the default model's training answers; cutting 16 to 12 changed 0.14% of its
    choices for 1,456 held-out questions, at the same chrF), and a longer one is judged by its beginning."""
    ids = replies[:, :min(RERANK_WIDTH, replies.shape[1])]
    inputs = tf.concat([tf.fill([tf.shape(ids)[0], 1], START_ID), ids[:, :-1]], axis=1)
    logits = model.decode(inputs, None, encoder_ids, training=False, cross_cache=cross_cache)
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


def agreement(replies, encoder_ids):
    """Token F1 between each candidate reply (batch, beams, length) and the retrieved answers on its
    encoder input (batch, src_len: after the first separator, outside the neighbours' `[start] question
    [end]`): (batch, beams) in [0, 1]; 0 where the input holds no retrieved answer."""
    context = encoder_ids * tf.cast(answer_positions(encoder_ids), encoder_ids.dtype)
    return token_f1(replies, context[:, None, :])[..., 0]


def beam_consensus(replies):
    """Each beam's mean token F1 with the other beams of its question (batch, beams, length) -> (batch, beams):
    the expected utility of minimum Bayes risk decoding, with token F1 as the utility and the beams weighed
    alike. A reply most beams share words with is rarely a broken one."""
    beams = tf.shape(replies)[1]
    overlap = token_f1(replies, replies)  # (batch, beams, beams), 1 on the diagonal for a non-empty beam
    others = tf.reduce_sum(overlap, axis=-1) - tf.linalg.diag_part(overlap)
    return others / tf.cast(tf.maximum(beams - 1, 1), tf.float32)

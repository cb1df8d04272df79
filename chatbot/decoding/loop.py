"""The loop: the encoder's pass once, then the decoder token by token through its key/value cache.

Owns: `Loop` (`State`; `start`, `step` and `advance`, which asks the plan's sampler for the next token; `run`
until every row ended; the best beam; the optional rerank against the retrieved answers) and `naive`, the same
tokens chosen by re-running the whole model on the whole prefix each step: the reference the cached loop is
tested against (as nanochat keeps its plain `generate` beside its engine). Every step is a TensorFlow op, so a plan
compiles the whole loop (XLA where asked). Must not read strings.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from chatbot.config import RerankConfig
from chatbot.decoding.prepare import Prepared
from chatbot.decoding.request import Options, Plan
from chatbot.decoding.rerank import agreement, beam_consensus, choose, features
from chatbot.decoding.samplers import NEG_INF, process_logits, sampler_for
from chatbot.tokenizer.subword import END_ID, PAD_ID, START_ID


class State(NamedTuple):
    """The decoding loop's state. Rows are replies: `num_beams` per question (one unless beam search)."""

    index: tf.Tensor  # position of the last written token
    tokens: tf.Tensor  # (rows, max_length + 1): start token, reply, padding
    finished: tf.Tensor  # (rows,) bool
    seen: tf.Tensor  # (rows, vocab) bool: tokens already in the reply
    scores: tf.Tensor  # (rows,) summed log-probability of each reply
    self_cache: tf.Tensor
    cross_cache: tf.Tensor
    encoder_ids: tf.Tensor  # (rows, src_len): what the decoder attends to and may copy from


class Loop:
    """`loop(prepared, options, plan)`: reply ids (batch, max_length) of one model, `rerank_weights` its fitted
    rerank weights."""

    def __init__(self, model, rerank_weights: RerankConfig):
        self.model, self.rerank_weights, self.max_length = model, rerank_weights, model.max_length

    def __call__(self, prepared: Prepared, options: Options, plan: Plan):
        """Encoder pass, `run` and the optional `rerank`: what a plan compiles."""
        cross_cache = self.encode(prepared.encoder_ids)  # for the loop and the rerank
        replies = self.run(prepared.encoder_ids, cross_cache, options, plan)
        return self.rerank(prepared, cross_cache, replies, options) if plan.candidates else replies

    def encode(self, encoder_ids):
        """The encoder's pass as the decoder reads it: each layer's cross-attention keys and values, once."""
        return self.model.cross_cache(self.model.encode(encoder_ids, training=False))

    def start(self, encoder_ids, cross_cache, plan: Plan) -> State:
        """The state before the first step; each question's row repeated `num_beams` times, only the first
        of them alive (the others start at -inf, so the first step does not pick one token twice)."""
        encoder_ids = tf.repeat(encoder_ids, plan.num_beams, axis=0)  # (rows, src_len)
        cross_cache = tf.repeat(cross_cache, plan.num_beams, axis=0)  # projected once per question, not per beam
        rows = tf.shape(encoder_ids)[0]
        tokens = tf.concat([tf.fill([rows, 1], START_ID), tf.fill([rows, self.max_length], PAD_ID)], axis=1)
        scores = tf.where(tf.range(rows) % plan.num_beams == 0, 0.0, NEG_INF)
        seen = tf.zeros([rows, self.model.vocab_size], tf.bool)
        return State(tf.constant(0), tokens, tf.zeros([rows], tf.bool), seen, scores, self.model.empty_cache(rows),
                     cross_cache, encoder_ids)

    def step(self, state: State, options: Options, plan: Plan) -> State:
        """Feed the last token through the key/value cache and let the plan's sampler choose the next one."""
        last = tf.gather(state.tokens, [state.index], axis=1)
        before = tf.gather(state.tokens, [tf.maximum(state.index - 1, 0)], axis=1) * tf.cast(state.index > 0, tf.int32)
        logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                    state.encoder_ids, before)
        return self.advance(state._replace(self_cache=self_cache), logits, options, plan)

    def advance(self, state: State, logits, options: Options, plan: Plan) -> State:
        """Process the next-token logits (special tokens, repetition penalty, n-gram ban, padding after the end),
        ask the plan's sampler for the next token and write it at index + 1; the cached and the naive decoder
        share it, so they differ only in how the logits are computed."""
        logits = process_logits(logits, state.tokens, state.index, state.seen, state.finished,
                                options.repetition_penalty, options.no_repeat_ngram_size)
        chosen, parents, scores = sampler_for(plan).next(logits, state.scores, state.index, options)
        if plan.num_beams > 1:  # a new row may continue another row of its question: move the rows along
            state = state._replace(tokens=tf.gather(state.tokens, parents), finished=tf.gather(state.finished, parents),
                                   seen=tf.gather(state.seen, parents), self_cache=tf.gather(state.self_cache, parents))
        seen = state.seen | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
        return state._replace(index=state.index + 1, tokens=_write(state.tokens, state.index + 1, chosen),
                              finished=state.finished | (chosen == END_ID), seen=seen, scores=scores)

    def run(self, encoder_ids, cross_cache, options: Options, plan: Plan):
        """The model's own replies (batch, max_length): `step` from `start` until every row ended or `options.steps`;
        for beam search each question's best beam (`best_beams`)."""
        state = tf.while_loop(
            lambda s: (s.index < options.steps) & ~tf.reduce_all(s.finished),
            lambda s: (self.step(s, options, plan),),
            (self.start(encoder_ids, cross_cache, plan),), maximum_iterations=self.max_length)[0]
        return self.best_beams(state, encoder_ids, options, plan)

    def best_beams(self, state: State, encoder_ids, options: Options, plan: Plan):
        """The replies of a finished loop (batch, max_length): for beam search each question's best beam by
        length-normalised score plus the `agreement` and `mbr` terms."""
        replies = state.tokens[:, 1:]
        if plan.num_beams == 1:
            return replies
        replies = tf.reshape(replies, [-1, plan.num_beams, self.max_length])  # (batch, beams, max_length)
        lengths = tf.reduce_sum(tf.cast(replies != PAD_ID, tf.float32), axis=-1)
        scores = tf.reshape(state.scores, [-1, plan.num_beams])
        normalised = scores / tf.maximum(lengths, 1.0) ** options.length_penalty
        normalised += options.agreement * agreement(replies, encoder_ids) + options.mbr * beam_consensus(replies)
        return tf.gather(replies, tf.argmax(normalised, axis=-1, output_type=tf.int32), batch_dims=1)

    def features(self, prepared: Prepared, cross_cache, replies, options: Options, weights: RerankConfig | None = None):
        """`chatbot.decoding.rerank.Features` of each generated reply (batch, max_length) and its retrieved answers
        (`weights`: the weights they will be chosen by, so that only what those weigh is computed; None: all)."""
        return features(self.model, prepared.encoder_ids, cross_cache, replies, prepared.retrieved, prepared.scores,
                        options.steps, weights)

    def rerank(self, prepared: Prepared, cross_cache, replies, options: Options):
        """Each question's reply chosen among its generated one (batch, max_length) and its retrieved answers,
        by `chatbot.decoding.rerank`'s features and this model's weights."""
        return choose(self.features(prepared, cross_cache, replies, options, self.rerank_weights), self.rerank_weights)

    def naive(self, prepared: Prepared, options: Options, plan: Plan):
        """The replies decoded the seed tutorial's way, eagerly: the whole model re-run on the whole prefix for every
        new token, no key/value cache, no compiled loop. The tokens are chosen by `advance`, as the cached loop's are,
        so the two must agree. `candidates` is left out: the rerank it adds runs on the finished replies. Slow on
        purpose: the oracle the cached loop is tested against."""
        state = self.start(prepared.encoder_ids, tf.zeros([tf.shape(prepared.encoder_ids)[0], 0]), plan)
        state = state._replace(self_cache=tf.zeros([tf.shape(state.tokens)[0], 0]))
        while int(state.index) < int(options.steps) and not bool(tf.reduce_all(state.finished)):
            prefix = state.tokens[:, :int(state.index) + 1]
            logits = self.model((state.encoder_ids, prefix), training=False)[:, -1]
            state = self.advance(state, logits, options, plan)
        return self.best_beams(state, prepared.encoder_ids, options, plan)


def _write(tokens, position, values):
    """tokens[:, position] = values, in a form XLA compiles (no dynamic scatter)."""
    column = tf.range(tf.shape(tokens)[1])[None] == position
    return tf.where(column, values[:, None], tokens)

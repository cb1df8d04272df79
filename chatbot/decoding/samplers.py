"""Choosing the next token: logit processors and the greedy, sampling and beam samplers.

Owns: special-token suppression, repetition penalty, no-repeat-n-gram blocking, padding after the
end, and the samplers behind one contract, `Sampler.next` (see there). Everything is a TensorFlow op
on fixed shapes, so it runs inside the compiled decoding loop. Must not know about strings.
"""

from __future__ import annotations

import tensorflow as tf

from chatbot.config import GenerationConfig
from chatbot.tokenizer.subword import END_ID, NUM_SPECIAL, PAD_ID

NEG_INF = -1e9


def suppress_special(logits, index):
    """Replies may end (END) but never contain pad/start/unk or the reserved tokens. `index` is the
    position of the last written token (0: the start token), and a reply never ends there: an
    undertrained model's favourite first token is often END, and an empty reply helps no one."""
    ids = tf.range(tf.shape(logits)[-1])
    allowed = (ids >= NUM_SPECIAL) | ((ids == END_ID) & (index > 0))
    return tf.where(allowed[None], logits, NEG_INF)


def apply_repetition_penalty(logits, seen, penalty):
    """CTRL-style: tokens already generated (`seen`, (batch, vocab) bool) get their logit divided
    by `penalty` when positive and multiplied when negative. penalty == 1 changes nothing."""
    penalised = tf.where(logits > 0, logits / penalty, logits * penalty)
    return tf.where(seen, penalised, logits)


def ban_repeated_ngrams(logits, tokens, index, n):
    """Forbid any token that would repeat an n-gram already in `tokens[:, :index + 1]`.

    `tokens` (batch, length) holds the start token and the reply so far; `index` is the position of the last
    written token; `n` is a scalar int tensor (below 2: no ban), so one compiled loop serves every size."""
    n = tf.convert_to_tensor(n, tf.int32)
    # the default (no ban) costs nothing: a step with a ban compares every gram written so far
    return tf.cond(n >= 2, lambda: _banned_ngrams(logits, tokens, index, n), lambda: logits)


def _banned_ngrams(logits, tokens, index, n):
    length = tokens.shape[1]
    starts = tf.range(length)[:, None]  # where a gram starts (j)
    offsets = tf.range(length - 1)[None]  # its first n - 1 tokens (k < n - 1)
    last = tf.clip_by_value(index - (n - 2) + tf.range(length - 1), 0, length - 1)  # the last n - 1 written
    gram = tf.gather(tokens, tf.clip_by_value(starts + offsets, 0, length - 1), axis=1)  # (batch, j, k)
    same = (gram == tf.gather(tokens, last, axis=1)[:, None, :]) | (offsets >= n - 1)[None]
    complete = (tf.range(length) <= index - n + 1) & (tf.range(length) + n - 1 < length)  # a gram already written
    matches = tf.reduce_all(same, axis=-1) & complete[None]  # (batch, j)
    followers = tf.gather(tokens, tf.clip_by_value(tf.range(length) + n - 1, 0, length - 1), axis=1)
    banned = tf.reduce_any(tf.one_hot(followers, tf.shape(logits)[-1], on_value=True, off_value=False)
                           & matches[..., None], axis=1)
    return tf.where(banned, NEG_INF, logits)


def only_padding_when_finished(logits, finished):
    """A finished row (`finished`, (rows,) bool) may only continue with padding, at no cost."""
    only_pad = tf.where(tf.range(tf.shape(logits)[-1]) == PAD_ID, 0.0, NEG_INF)
    return tf.where(finished[:, None], only_pad[None], logits)


def process_logits(logits, tokens, index, seen, finished, repetition_penalty, no_repeat_ngram_size):
    logits = suppress_special(logits, index)
    logits = apply_repetition_penalty(logits, seen, repetition_penalty)
    logits = ban_repeated_ngrams(logits, tokens, index, no_repeat_ngram_size)
    return only_padding_when_finished(logits, finished)


class Sampler:
    """The contract every sampler keeps: `next(logits, scores, step, options) -> (tokens, parents, scores)`.

    Rows are the replies being decoded: `num_beams` per question, one for greedy and sampling.
    `logits` (rows, vocab) are the processed logits of the next token; `scores` (rows,) each row's
    summed log-probability so far; `step` the position of the last written token; `options` the
    tensor decoding options (`temperature`, `top_k`, `top_p`, `seed`, ...). Returns the chosen
    tokens (rows,), the row each new row continues (rows,) and the new scores (rows,). A sampler
    with one row per question keeps every row in place and only implements `choose`.
    """

    num_beams = 1

    @classmethod
    def from_settings(cls, settings: GenerationConfig) -> "Sampler":
        return cls()

    def choose(self, logits, step, options):
        raise NotImplementedError

    def next(self, logits, scores, step, options):
        tokens = self.choose(logits, step, options)
        chosen_log_probs = tf.gather(tf.nn.log_softmax(logits), tokens, axis=-1, batch_dims=1)
        return tokens, tf.range(tf.shape(tokens)[0]), scores + chosen_log_probs


class GreedySampler(Sampler):
    """The most likely token."""

    def choose(self, logits, step, options):
        return tf.argmax(logits, axis=-1, output_type=tf.int32)


class TopKTopPSampler(Sampler):
    """Sample from softmax(logits / temperature) restricted to the `top_k` most likely tokens
    (0 = all) and to the smallest set whose probability reaches `top_p` (1.0 = all).
    `options.seed` and the step make the draw reproducible (stateless random ops)."""

    def choose(self, logits, step, options):
        logits = logits / options.temperature
        vocab = tf.shape(logits)[-1]
        ordered = tf.sort(logits, axis=-1, direction="DESCENDING")
        k = tf.where(options.top_k > 0, tf.minimum(options.top_k, vocab), vocab)
        kth = tf.gather(ordered, k - 1, axis=-1)[:, None]
        probs = tf.nn.softmax(ordered, axis=-1)
        before = tf.cumsum(probs, axis=-1, exclusive=True)  # mass of strictly more likely tokens
        # At least the likeliest token: a top_p the config accepts (1e-170 > 0) can round to 0.0 in float32.
        kept = tf.maximum(tf.reduce_sum(tf.cast(before < options.top_p, tf.int32), axis=-1), 1)
        pth = tf.gather(ordered, kept - 1, axis=-1, batch_dims=1)[:, None]
        logits = tf.where((logits >= kth) & (logits >= pth), logits, NEG_INF)
        seed = tf.stack([options.seed, tf.cast(step, tf.int32)])
        return tf.cast(tf.random.stateless_categorical(logits, 1, seed)[:, 0], tf.int32)


class BeamSampler(Sampler):
    """Keep the `num_beams` best partial replies of each question by summed log-probability.

    Rows come in groups of `num_beams` per question. Each step keeps the best `num_beams`
    continuations of the whole group, so a new row may continue another row of its group
    (`parents`). A finished row continues only with padding at no cost (the decoder masks its
    logits), so it keeps its score and competes as it is.
    """

    def __init__(self, num_beams: int):
        self.num_beams = num_beams

    @classmethod
    def from_settings(cls, settings: GenerationConfig) -> "BeamSampler":
        return cls(settings.num_beams)

    def next(self, logits, scores, step, options):
        vocab = tf.shape(logits)[-1]
        candidates = scores[:, None] + tf.nn.log_softmax(logits)  # (batch*beams, vocab)
        candidates = tf.reshape(candidates, [-1, self.num_beams * vocab])
        scores, flat = tf.math.top_k(candidates, k=self.num_beams)  # (batch, beams)
        parents = flat // vocab + tf.range(tf.shape(candidates)[0])[:, None] * self.num_beams
        return tf.reshape(flat % vocab, [-1]), tf.reshape(parents, [-1]), tf.reshape(scores, [-1])


SAMPLERS = {"greedy": GreedySampler, "beam": BeamSampler, "sample": TopKTopPSampler}  # by `strategy`


def sampler_for(settings) -> Sampler:
    """The sampler of `settings` (a `GenerationConfig` or a `chatbot.decoding.request.Plan`: both name a strategy and a width)."""
    return SAMPLERS[settings.strategy].from_settings(settings)

"""Sentence embeddings: a small transformer encoder that maps a question to a unit vector, so that two
phrasings of one message land close together whatever characters they share.

Owns: `SentenceEncoder` (subword ids -> l2-normalised vectors: embedding, a few encoder blocks, mean over
the tokens), the contrastive loss it learns from (in-batch negatives, as Sentence-BERT's
MultipleNegativesRankingLoss: each question must pick out its paraphrase among the batch's other
questions' paraphrases, both ways), and `fit_sentence_encoder`, which trains it on groups of paraphrases
(in `train`: the questions that share an answer, with that answer, `answer_groups`; bench/retrieval.py also
groups the bundled data's situations). Pure Keras 3 (`keras.ops`), so it
trains on any backend; tokenizing stays with the caller. Must not read files or know about the chatbot.
"""

from __future__ import annotations

import math
import random

import keras
import numpy as np
from keras import ops

from chatbot.model.layers import EncoderLayer, PositionalEmbedding, padding_mask, register

SENTENCE_LENGTH = 32  # subword ids an embedded text keeps (the questions of the bundled data have at most 30)
SCALE = 20.0  # cosine similarities times this are the loss's logits (Sentence-BERT's default)
# A fit of at most this many steps runs eagerly: tracing the training step costs about as much as twenty eager
# steps on a CPU, so a small CSV's encoder (a few steps) trains in a third of the time (bench/small_fits.py).
EAGER_STEPS = 16


@register
class SentenceEncoder(keras.Model):
    """Ids (batch, seq), 0 as padding -> l2-normalised embeddings (batch, d_model)."""

    def __init__(self, vocab_size, d_model=128, num_layers=2, num_heads=4, dff=256, dropout=0.1,
                 max_length=SENTENCE_LENGTH, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.num_layers = vocab_size, d_model, num_layers
        self.num_heads, self.dff, self.dropout, self.max_length = num_heads, dff, dropout, max_length
        self.embedding = PositionalEmbedding(vocab_size, d_model, max_length, name="embedding")
        self.blocks = [EncoderLayer(d_model, num_heads, dff, dropout, name=f"block_{i}") for i in range(num_layers)]
        self.projection = keras.layers.Dense(d_model, name="projection")

    def call(self, ids, training=None):
        ids = ops.convert_to_tensor(ids, "int32")[:, :self.max_length]
        mask = padding_mask(ids)
        x = self.embedding(ids)
        for block in self.blocks:
            x = block(x, mask, training=training)
        kept = ops.cast(ops.not_equal(ids, 0), x.dtype)[:, :, None]
        pooled = ops.sum(x * kept, axis=1) / ops.maximum(ops.sum(kept, axis=1), 1.0)
        return normalize(self.projection(pooled))

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "num_layers": self.num_layers, "num_heads": self.num_heads, "dff": self.dff,
                "dropout": self.dropout, "max_length": self.max_length}


def normalize(x):
    return x / ops.sqrt(ops.maximum(ops.sum(ops.square(x), axis=-1, keepdims=True), 1e-12))


def contrastive_loss(anchors, positives, groups, scale: float = SCALE):
    """In-batch negatives, both ways: row i of `anchors` must score its own `positives[i]` above every other
    positive of the batch, and the other way round. Another row of the same group is no negative (masked)."""
    logits = scale * ops.matmul(anchors, ops.transpose(positives))
    size = ops.shape(logits)[0]
    same = ops.logical_and(ops.equal(groups[:, None], groups[None, :]), ~ops.eye(size, dtype="bool"))
    logits = ops.where(same, -1e4, logits)
    labels = ops.arange(size)
    forward = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
    backward = keras.losses.sparse_categorical_crossentropy(labels, ops.transpose(logits), from_logits=True)
    return ops.mean(forward + backward) / 2


class _PairTrainer(keras.Model):
    """Fits a `SentenceEncoder` on (anchor ids, positive ids, group) batches with `contrastive_loss`."""

    def __init__(self, encoder: SentenceEncoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder

    def call(self, inputs, training=None):
        return self.encoder(inputs["anchor"], training=training), self.encoder(inputs["positive"], training=training)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        anchors, positives = y_pred
        return contrastive_loss(anchors, positives, ops.convert_to_tensor(x["group"]))


def paraphrase_pairs(groups: list[list[int]], rng: random.Random) -> list[tuple[int, int, int]]:
    """(anchor, positive, group) for every member of every group of two or more: each member is paired with
    another member chosen at random."""
    pairs = []
    for group, members in enumerate(groups):
        if len(members) < 2:
            continue
        for i, member in enumerate(members):
            other = rng.randrange(len(members) - 1)
            pairs.append((member, members[other + (other >= i)], group))
    return pairs


def answer_groups(pairs) -> tuple[list[str], list[list[int]]]:
    """What an encoder learns "same meaning" from in Q&A pairs: the questions that share an answer, with the
    answer itself (so a message also lands near the answer it asks for). Returns the distinct texts and the
    groups as lists of their indices."""
    texts: dict[str, int] = {}
    groups: dict[str, list[int]] = {}
    for pair in pairs:
        members = groups.setdefault(pair.answer, [texts.setdefault(pair.answer, len(texts))])
        index = texts.setdefault(pair.question, len(texts))
        if index not in members:
            members.append(index)
    return list(texts), list(groups.values())


def pad(ids: list[list[int]], length: int = SENTENCE_LENGTH) -> np.ndarray:
    out = np.zeros((len(ids), length), np.int32)
    for row, seq in enumerate(ids):
        seq = seq[:length]
        out[row, :len(seq)] = seq
    return out


def fit_sentence_encoder(token_ids: list[list[int]], groups: list[list[int]], vocab_size: int, epochs: int = 8,
                         batch_size: int = 128, seed: int = 0, learning_rate: float = 1e-3, verbose: int = 0,
                         encoder: SentenceEncoder | None = None) -> SentenceEncoder:
    """Train an encoder (or go on training `encoder`) so the texts of one group embed close together.

    `token_ids`: every text's subword ids; `groups`: lists of indices into them, each a set of texts that mean
    the same (phrasings of one message, or questions with one answer, or a question and its answer). Each epoch
    pairs every member with another member of its group, afresh."""
    # Python's and NumPy's generators only: `keras.utils.set_random_seed` would also reset TensorFlow's, which
    # deletes the SentencePiece resource of every tokenizer already loaded (see `chatbot.training.train.seed_generators`).
    random.seed(seed)
    np.random.seed(seed)
    rng = random.Random(seed)
    encoder = encoder or SentenceEncoder(vocab_size)
    trainer = _PairTrainer(encoder, name="pair_trainer")
    ids = pad(token_ids)
    pairs = []
    for _ in range(epochs):  # drawn afresh for each epoch, fitted in one call (one trace of the step, not one a pass)
        drawn = paraphrase_pairs(groups, rng)
        rng.shuffle(drawn)
        pairs += drawn
    steps = max(1, math.ceil(len(pairs) / batch_size))  # the cosine decay ends with the last batch
    trainer.compile(optimizer=keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(learning_rate, steps)),
                    run_eagerly=steps <= EAGER_STEPS)
    anchors, positives, group = (np.asarray(column) for column in zip(*pairs))
    inputs = {"anchor": ids[anchors], "positive": ids[positives], "group": group.astype(np.int32)}
    trainer.fit(inputs, batch_size=batch_size, epochs=1, shuffle=False, verbose=verbose)
    return encoder


def embed(encoder: SentenceEncoder, token_ids: list[list[int]], batch_size: int = 512) -> np.ndarray:
    """Unit vectors (texts, d_model) of many texts' ids, in batches of texts of about one length (each padded
    only to its longest: embedding a model's whole index is part of every load)."""
    order = sorted(range(len(token_ids)), key=lambda i: len(token_ids[i]))
    out = np.zeros((len(token_ids), encoder.d_model), np.float32)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        longest = min(max(1, max(len(token_ids[i]) for i in rows)), encoder.max_length)
        out[rows] = ops.convert_to_numpy(encoder(pad([token_ids[i] for i in rows], longest)))
    return out

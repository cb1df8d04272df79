"""Serializable Keras 3 layers of the encoder-decoder transformer, with a key/value cache.

Owns: masks, positional embedding, multi-head attention (training path and cached decoding
path), encoder and decoder blocks. Masks are boolean, True where attention is allowed.
Must not read files or tokenize.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from chatbot.tokenizer.special import END_ID, NUM_SPECIAL, SEPARATOR_ID, START_ID

register = keras.saving.register_keras_serializable(package="chatbot")


def padding_mask(ids):
    """(batch, seq) ids -> (batch, 1, 1, seq) mask, False at padding (id 0)."""
    return ops.expand_dims(ops.expand_dims(ops.not_equal(ids, 0), 1), 1)


def look_ahead_mask(length):
    """(1, 1, length, length) lower-triangular mask: position i sees positions <= i."""
    return ops.expand_dims(ops.expand_dims(ops.tril(ops.ones((length, length), dtype="bool")), 0), 0)


def causal_mask(ids):
    """Look-ahead mask combined with the padding mask of decoder ids: (batch, 1, seq, seq)."""
    return ops.logical_and(look_ahead_mask(ops.shape(ids)[1]), padding_mask(ids))


def answer_positions(encoder_ids):
    """Where the retrieved answers sit in encoder inputs (batch, src_len): True after the first separator,
    outside any neighbour's `[start] question [end]`, and never on a special token."""
    def count(token, exclusive=False):
        hits = ops.cast(ops.equal(encoder_ids, token), "int32")
        counted = ops.cumsum(hits, axis=1)
        return counted - hits if exclusive else counted

    answer = ops.logical_and(count(SEPARATOR_ID) > 0, count(START_ID) <= count(END_ID, exclusive=True))
    return ops.logical_and(answer, encoder_ids >= NUM_SPECIAL)


def positional_encoding(length: int, depth: int) -> np.ndarray:
    """Sinusoidal table (length, depth): sin on even features, cos on odd ones."""
    positions = np.arange(length)[:, None]
    rates = 1.0 / np.power(10000.0, (2 * (np.arange(depth)[None, :] // 2)) / depth)
    angles = positions * rates
    table = np.zeros((length, depth), dtype="float32")
    table[:, 0::2] = np.sin(angles[:, 0::2])
    table[:, 1::2] = np.cos(angles[:, 1::2])
    return table


@register
class PositionalEmbedding(keras.layers.Layer):
    """Token embedding scaled by sqrt(d_model) plus a sinusoidal position table of `max_length` rows.

    Call arguments: `ids` (batch, seq); `start` the position of the first id (decoding one token
    at a time passes the step index).
    """

    def __init__(self, vocab_size, d_model, max_length, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.d_model, self.max_length = vocab_size, d_model, max_length
        self.embedding = keras.layers.Embedding(vocab_size, d_model, dtype=self.dtype_policy, name="embedding")
        self.table = positional_encoding(max_length, d_model)

    def build(self, input_shape):
        self.embedding.build(input_shape)
        super().build(input_shape)

    def call(self, ids, start=0):
        length = ops.shape(ids)[1]
        x = self.embedding(ids) * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        positions = ops.slice(ops.convert_to_tensor(self.table), [start, 0], [length, self.d_model])
        return x + ops.cast(positions, self.compute_dtype)[None]

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "d_model": self.d_model,
                "max_length": self.max_length}


@register
class MultiHeadAttention(keras.layers.Layer):
    """Scaled dot-product attention over `num_heads` heads, with one output projection.

    `call(query, memory, mask)` is the training path. For decoding, `project_key_value(memory)`
    gives (key, value) of shape (batch, seq, heads, depth) once, and `attend(query, key, value,
    mask)` reuses them. Scores are masked and soft-maxed in float32, so mixed precision cannot
    overflow. Returns the output (batch, q_len, d_model) and the weights (batch, heads, q_len, k_len).
    """

    def __init__(self, d_model, num_heads, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.dropout = d_model, num_heads, dropout
        self.depth = d_model // num_heads
        dense = lambda name: keras.layers.Dense(d_model, dtype=self.dtype_policy, name=name)  # noqa: E731
        self.query_dense, self.key_dense, self.value_dense = dense("query"), dense("key"), dense("value")
        self.output_dense = dense("output")
        self.weights_dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)

    def build(self, query_shape, memory_shape=None):
        memory_shape = memory_shape or query_shape
        self.query_dense.build(query_shape)
        self.key_dense.build(memory_shape)
        self.value_dense.build(memory_shape)
        self.output_dense.build(query_shape[:-1] + (self.d_model,))
        super().build(query_shape)

    def split_heads(self, x):
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, length, self.num_heads, self.depth))  # (batch, seq, heads, depth)

    def project_key_value(self, memory):
        return self.split_heads(self.key_dense(memory)), self.split_heads(self.value_dense(memory))

    def attend(self, query, key, value, mask=None, training=None):
        q = self.split_heads(self.query_dense(query))
        scores = ops.einsum("bqhd,bkhd->bhqk", q, key) / ops.cast(math.sqrt(self.depth), q.dtype)
        scores = ops.cast(scores, "float32")
        if mask is not None:
            scores = ops.where(mask, scores, ops.cast(-1e9, "float32"))
        weights = ops.softmax(scores, axis=-1)  # (batch, heads, q_len, k_len)
        dropped = self.weights_dropout(ops.cast(weights, self.compute_dtype), training=training)
        context = ops.einsum("bhqk,bkhd->bqhd", dropped, value)
        batch, length = ops.shape(context)[0], ops.shape(context)[1]
        context = ops.reshape(context, (batch, length, self.d_model))
        return self.output_dense(context), weights

    def call(self, query, memory, mask=None, training=None):
        key, value = self.project_key_value(memory)
        return self.attend(query, key, value, mask, training=training)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dropout": self.dropout}


def _feed_forward(d_model, dff, policy):
    return keras.Sequential([keras.layers.Dense(dff, activation="relu", dtype=policy),
                             keras.layers.Dense(d_model, dtype=policy)], name="feed_forward")


@register
class EncoderLayer(keras.layers.Layer):
    """Post-LN block: self-attention, then a ReLU feed-forward; dropout on both sublayers."""

    def __init__(self, d_model, num_heads, dff, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.dff, self.dropout = d_model, num_heads, dff, dropout
        policy = self.dtype_policy
        self.attention = MultiHeadAttention(d_model, num_heads, dropout=0.0, dtype=policy, name="self_attention")
        self.feed_forward = _feed_forward(d_model, dff, policy)
        self.norm1 = keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)
        self.norm2 = keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy)
        self.dropout1 = keras.layers.Dropout(dropout, dtype=policy)
        self.dropout2 = keras.layers.Dropout(dropout, dtype=policy)

    def build(self, x_shape):
        self.attention.build(x_shape)
        self.feed_forward.build(x_shape)
        self.norm1.build(x_shape)
        self.norm2.build(x_shape)
        super().build(x_shape)

    def call(self, x, mask=None, training=None):
        attended, _ = self.attention(x, x, mask, training=training)
        x = self.norm1(x + self.dropout1(attended, training=training))
        return self.norm2(x + self.dropout2(self.feed_forward(x), training=training))  # (batch, seq, d_model)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dff": self.dff, "dropout": self.dropout}


@register
class DecoderLayer(keras.layers.Layer):
    """Post-LN block: masked self-attention, cross-attention over the encoder output, feed-forward.

    `call` runs a whole target sequence (training). `step` runs one position against a key/value
    cache: `self_cache` (batch, 2, max_length, heads, depth) holds this layer's past keys and values
    and is returned updated at `index`; `cross_cache` (batch, 2, src_len, heads, depth) holds the
    projected encoder output, computed once per request.
    """

    def __init__(self, d_model, num_heads, dff, dropout=0.1, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.num_heads, self.dff, self.dropout = d_model, num_heads, dff, dropout
        policy = self.dtype_policy
        self.self_attention = MultiHeadAttention(d_model, num_heads, dtype=policy, name="self_attention")
        self.cross_attention = MultiHeadAttention(d_model, num_heads, dtype=policy, name="cross_attention")
        self.feed_forward = _feed_forward(d_model, dff, policy)
        self.norms = [keras.layers.LayerNormalization(epsilon=1e-6, dtype=policy) for _ in range(3)]
        self.dropouts = [keras.layers.Dropout(dropout, dtype=policy) for _ in range(3)]

    def build(self, x_shape, memory_shape=None):
        self.self_attention.build(x_shape)
        self.cross_attention.build(x_shape, memory_shape)
        self.feed_forward.build(x_shape)
        for norm in self.norms:
            norm.build(x_shape)
        super().build(x_shape)

    def _sublayers(self, x, self_attended, cross_key_value, memory_mask, training):
        x = self.norms[0](x + self.dropouts[0](self_attended, training=training))
        crossed, cross_weights = self.cross_attention.attend(x, *cross_key_value, memory_mask, training=training)
        x = self.norms[1](x + self.dropouts[1](crossed, training=training))
        x = self.norms[2](x + self.dropouts[2](self.feed_forward(x), training=training))
        return x, cross_weights

    def call(self, x, memory, self_mask=None, memory_mask=None, training=None, cross_key_value=None):
        """`cross_key_value`: memory's projected keys and values, if the caller has them (then `memory` is unused)."""
        attended, _ = self.self_attention(x, x, self_mask, training=training)
        if cross_key_value is None:
            cross_key_value = self.cross_attention.project_key_value(memory)
        return self._sublayers(x, attended, cross_key_value, memory_mask, training)  # (batch, seq, d_model), weights

    def step(self, x, index, self_cache, cross_cache, memory_mask=None):
        """x (batch, 1, d_model) at position `index` -> (output, cross weights, updated self_cache)."""
        key, value = self.self_attention.project_key_value(x)
        new_key_value = ops.stack([key, value], axis=1)  # (batch, 2, 1, heads, depth)
        self_cache = ops.slice_update(self_cache, [0, 0, index, 0, 0], ops.cast(new_key_value, self_cache.dtype))
        max_length = ops.shape(self_cache)[2]
        seen = ops.reshape(ops.arange(max_length) <= index, (1, 1, 1, max_length))
        attended, _ = self.self_attention.attend(x, self_cache[:, 0], self_cache[:, 1], seen)
        x, cross_weights = self._sublayers(x, attended, (cross_cache[:, 0], cross_cache[:, 1]), memory_mask, False)
        return x, cross_weights, self_cache

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "num_heads": self.num_heads,
                "dff": self.dff, "dropout": self.dropout}


@register
class CopyHead(keras.layers.Layer):
    """Pointer-generator output (See et al. 2017): the vocabulary distribution mixed, position by position,
    with one attention over the encoder positions the reply may copy from (the retrieved answers), so copying
    a fluent answer token by token is one easy decision and a blend of two is not.

    `project_key(memory)` gives the attention's keys (batch, src_len, d_model) once per question (`call` also
    takes them split into heads, as `Transformer.cross_cache` keeps them);
    `call(x, logits, keys, encoder_ids, copyable, written, before)` gives float32 log-probabilities (batch, len,
    vocab) of (1 - gate) * softmax(logits) + gate * copy, where `copy` sums the attention over positions holding
    each token. Rows with no copyable position get gate 0: the plain vocabulary distribution.
    `written` and `before` (batch, len) are the reply's last token and the one before it at each position
    (`start_id` and padding at the start). A source position right after the same one (or two) tokens in the
    source gets a learned bonus, in the attention and in the gate: where a copy stands is then plain, and a
    copy neither skips nor repeats a piece. A reply's start continues a `separator_id`.
    """

    def __init__(self, d_model, vocab_size, start_id=1, separator_id=4, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.vocab_size, self.start_id, self.separator_id = d_model, vocab_size, start_id, separator_id
        self.query_dense = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="query")
        self.key_dense = keras.layers.Dense(d_model, dtype=self.dtype_policy, name="key")
        self.gate_dense = keras.layers.Dense(1, dtype="float32", name="gate")

    def build(self, x_shape, memory_shape=None):
        self.query_dense.build(x_shape)
        self.key_dense.build(memory_shape or x_shape)
        self.gate_dense.build(x_shape)
        # bonus for continuing after one and after two matching tokens: in the scores, then in the gate
        self.continuation = self.add_weight(shape=(4,), initializer=keras.initializers.Constant([1.0, 1.0, 0.0, 0.0]),
                                            dtype="float32", name="continuation")
        super().build(x_shape)

    def project_key(self, memory):
        return self.key_dense(memory)

    def continues(self, encoder_ids, copyable, written, before):
        """(after the last token, after the last two) (batch, len, src_len) bool: copyable positions that
        follow, in the source, the token(s) the reply just wrote."""
        def shifted(ids, by):
            return ops.pad(ids, [[0, 0], [by, 0]], constant_values=-1)[:, :ops.shape(ids)[1]]

        def as_source(ids):  # the reply's start stands where an answer starts: after a separator
            return ops.where(ops.equal(ids, self.start_id), self.separator_id, ids)

        one = ops.equal(shifted(encoder_ids, 1)[:, None, :], as_source(written)[:, :, None]) & copyable[:, None, :]
        two = one & ops.equal(shifted(encoder_ids, 2)[:, None, :], as_source(before)[:, :, None])
        return one, two

    def parts(self, x, keys, encoder_ids, copyable, written, before):
        """The gate (batch, len, 1) and the copy attention (batch, len, src_len), float32."""
        query, keys = self.query_dense(x), ops.reshape(keys, (ops.shape(keys)[0], ops.shape(keys)[1], self.d_model))
        scores = ops.cast(ops.einsum("bqd,bkd->bqk", query, keys), "float32") / math.sqrt(self.d_model)
        one, two = (ops.cast(follows, "float32") for follows in self.continues(encoder_ids, copyable, written, before))
        bonus = ops.cast(self.continuation, "float32")  # under mixed precision Keras hands variables over as float16
        scores = scores + bonus[0] * one + bonus[1] * two
        weights = ops.softmax(ops.where(copyable[:, None, :], scores, -1e9), axis=-1)
        has_source = ops.cast(ops.any(copyable, axis=-1), "float32")[:, None, None]
        gate_logit = (self.gate_dense(ops.cast(x, "float32")) + bonus[2] * ops.max(one, -1, keepdims=True)
                      + bonus[3] * ops.max(two, -1, keepdims=True))
        return ops.sigmoid(gate_logit) * has_source, weights

    def call(self, x, logits, keys, encoder_ids, copyable, written, before):
        gate, weights = self.parts(x, keys, encoder_ids, copyable, written, before)
        copy = ops.einsum("bqk,bkv->bqv", weights, ops.one_hot(encoder_ids, self.vocab_size, dtype="float32"))
        mixed = (1.0 - gate) * ops.softmax(ops.cast(logits, "float32"), axis=-1) + gate * copy
        return ops.log(mixed + 1e-9)

    def get_config(self):
        return {**super().get_config(), "d_model": self.d_model, "vocab_size": self.vocab_size,
                "start_id": self.start_id, "separator_id": self.separator_id}

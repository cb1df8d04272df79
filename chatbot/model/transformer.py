"""The encoder-decoder `Transformer` (Vaswani et al. 2017, post-LN) as one Keras 3 model.

Owns: `call` for teacher-forced training, and the inference entry points `encode`,
`init_cache` and `decode_step` that generation builds its compiled loops on.
Must not do I/O.
"""

from __future__ import annotations

import keras
from keras import ops

from chatbot.config import ModelConfig
from chatbot.model.layers import (CopyHead, DecoderLayer, EncoderLayer, PositionalEmbedding, answer_positions, causal_mask,
                            padding_mask, register)
from chatbot.tokenizer.special import PAD_ID, SEPARATOR_ID, START_ID


@register
class Transformer(keras.Model):
    """Inputs `(encoder_inputs, decoder_inputs)`, int ids padded with 0, of shapes (batch, <= encoder_length)
    and (batch, <= max_length). Returns float32 logits (batch, decoder_len, vocab_size).
    `encoder_length` (default `max_length`) leaves room for retrieved answers after the question.
    `shared_embeddings`: the output layer is the decoder's token embedding, transposed (Press & Wolf
    2017; the paper's weight sharing), instead of a Dense layer of its own.
    `copy_head`: a pointer-generator output (`CopyHead`) that may copy tokens of the retrieved answers;
    its "logits" are then log-probabilities, which every softmax, loss and sampler reads alike."""

    def __init__(self, vocab_size, num_layers=4, d_model=128, num_heads=4, dff=512, dropout=0.1,
                 max_length=40, encoder_length=None, shared_embeddings=False, copy_head=False, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.num_layers, self.d_model = vocab_size, num_layers, d_model
        self.num_heads, self.dff, self.dropout, self.max_length = num_heads, dff, dropout, max_length
        self.encoder_length = encoder_length or max_length
        self.shared_embeddings, self.has_copy_head = shared_embeddings, copy_head
        policy = self.dtype_policy
        self.encoder_embedding = PositionalEmbedding(vocab_size, d_model, self.encoder_length, dtype=policy,
                                                     name="encoder_embedding")
        self.decoder_embedding = PositionalEmbedding(vocab_size, d_model, max_length, dtype=policy,
                                                     name="decoder_embedding")
        self.encoder_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.decoder_dropout = keras.layers.Dropout(dropout, dtype=policy)
        self.encoder_layers = [EncoderLayer(d_model, num_heads, dff, dropout, dtype=policy, name=f"encoder_{i}")
                               for i in range(num_layers)]
        self.decoder_layers = [DecoderLayer(d_model, num_heads, dff, dropout, dtype=policy, name=f"decoder_{i}")
                               for i in range(num_layers)]
        # Logits in float32 so the softmax and the loss stay exact under mixed precision.
        self.final_dense = None if shared_embeddings else keras.layers.Dense(vocab_size, dtype="float32",
                                                                              name="logits")
        self.copy_head = CopyHead(d_model, vocab_size, START_ID, SEPARATOR_ID, dtype=policy,
                                  name="copy_head") if copy_head else None

    @classmethod
    def from_config_dataclass(cls, config: ModelConfig, **kwargs) -> "Transformer":
        return cls(config.vocab_size, config.num_layers, config.d_model, config.num_heads, config.dff,
                   config.dropout, config.max_length, config.encoder_length or None, config.shared_embeddings,
                   config.copy_head, **kwargs)

    def build(self, input_shape):
        """Build every sublayer from the (encoder, decoder) id shapes. Without it Keras builds the model by
        running it symbolically, on every load too: about a second of a one-question `chat -q`."""
        encoder_shape, decoder_shape = (tuple(shape) for shape in input_shape)
        memory_shape, hidden_shape = (*encoder_shape, self.d_model), (*decoder_shape, self.d_model)
        self.encoder_embedding.build(encoder_shape)
        self.decoder_embedding.build(decoder_shape)
        for layer in self.encoder_layers:
            layer.build(memory_shape)
        for layer in self.decoder_layers:
            layer.build(hidden_shape, memory_shape)
        if self.final_dense is not None:
            self.final_dense.build(hidden_shape)
        if self.copy_head is not None:
            self.copy_head.build(hidden_shape, memory_shape)
        self.built = True

    def encode(self, encoder_inputs, training=None):
        """Ids (batch, src_len) -> memory (batch, src_len, d_model)."""
        mask = padding_mask(encoder_inputs)
        x = self.encoder_dropout(self.encoder_embedding(encoder_inputs), training=training)
        for layer in self.encoder_layers:
            x = layer(x, mask, training=training)
        return x

    def decode(self, decoder_inputs, memory, encoder_ids, training=None, return_attention=False, cross_cache=None):
        """Teacher-forced decoder over a whole target prefix -> logits (and per-layer cross-attention).
        `encoder_ids`: the ids `memory` was encoded from (their padding is masked, their answers copied).
        `cross_cache`: memory's keys and values (`cross_cache`), if the caller has them; then `memory` is
        not read (pass None)."""
        x, attention = self.decode_hidden(decoder_inputs, memory, encoder_ids, training, cross_cache)
        copy_keys = None
        if self.copy_head is not None:
            copy_keys = self.copy_head.project_key(memory) if cross_cache is None else cross_cache[:, self.num_layers, 0]
        logits = self.predictions(x, encoder_ids, copy_keys, decoder_inputs, preceding(decoder_inputs))
        return (logits, attention) if return_attention else logits

    def decode_hidden(self, decoder_inputs, memory, encoder_ids, training=None, cross_cache=None):
        """The decoder layers alone: the last one's output (batch, len, d_model) and every layer's cross-attention."""
        memory_mask, self_mask = padding_mask(encoder_ids), causal_mask(decoder_inputs)
        x = self.decoder_dropout(self.decoder_embedding(decoder_inputs), training=training)
        attention = []
        for i, layer in enumerate(self.decoder_layers):
            key_value = None if cross_cache is None else (cross_cache[:, i, 0], cross_cache[:, i, 1])
            x, weights = layer(x, memory, self_mask, memory_mask, training=training, cross_key_value=key_value)
            attention.append(weights)
        return x, attention

    def predictions(self, x, encoder_ids, copy_keys=None, written=None, before=None):
        """Decoder output (batch, len, d_model) -> float32 logits, or with the copy head log-probabilities
        (`written`, `before`: the reply's tokens at and before each position, which the copy head continues)."""
        logits = self.logits(x)
        if self.copy_head is None:
            return logits
        return self.copy_head(x, logits, copy_keys, encoder_ids, answer_positions(encoder_ids), written, before)

    def logits(self, x):
        """Decoder output (batch, len, d_model) -> float32 logits (batch, len, vocab_size)."""
        if self.final_dense is not None:
            return self.final_dense(x)
        return ops.matmul(ops.cast(x, "float32"), ops.transpose(self.decoder_embedding.embedding.embeddings))

    def call(self, inputs, training=None):
        encoder_inputs, decoder_inputs = inputs
        memory = self.encode(encoder_inputs, training=training)
        return self.decode(decoder_inputs, memory, encoder_inputs, training=training)

    def init_cache(self, memory, max_length=None):
        """Empty self-attention cache (batch, layers, 2, max_length, heads, depth) and the
        cross-attention keys/values of `memory` (batch, layers, 2, src_len, heads, depth)."""
        return self.empty_cache(ops.shape(memory)[0], max_length), self.cross_cache(memory)

    def empty_cache(self, batch, max_length=None):
        """An empty self-attention cache (batch, layers, 2, max_length, heads, depth)."""
        depth = self.d_model // self.num_heads
        return ops.zeros((batch, self.num_layers, 2, max_length or self.max_length, self.num_heads, depth),
                         dtype=self.compute_dtype)

    def cross_cache(self, memory):
        """The cross-attention keys/values of `memory`, every layer's (batch, layers, 2, src_len, heads, depth);
        with the copy head, one more "layer" holds its keys (twice, to keep the shape)."""
        cross = [ops.stack(layer.cross_attention.project_key_value(memory), axis=1) for layer in self.decoder_layers]
        if self.copy_head is not None:
            keys = self.decoder_layers[0].cross_attention.split_heads(self.copy_head.project_key(memory))
            cross.append(ops.stack([keys, keys], axis=1))
        return ops.stack(cross, axis=1)

    def decode_step(self, token_ids, index, self_cache, cross_cache, encoder_ids, before=None, return_attention=False):
        """One decoder position: token_ids (batch, 1) at `index` -> logits (batch, vocab), updated cache.
        `before` (batch, 1): the token before them (padding at index 0), for the copy head."""
        x = self.decoder_embedding(token_ids, start=index)
        memory_mask = padding_mask(encoder_ids)
        layer_caches, attention = [], []
        for i, layer in enumerate(self.decoder_layers):
            x, weights, layer_cache = layer.step(x, index, self_cache[:, i], cross_cache[:, i], memory_mask)
            layer_caches.append(layer_cache)
            attention.append(weights)
        copy_keys = None if self.copy_head is None else cross_cache[:, self.num_layers, 0]
        before = ops.zeros_like(token_ids) if before is None else before
        logits = self.predictions(x, encoder_ids, copy_keys, token_ids, before)[:, 0]
        self_cache = ops.stack(layer_caches, axis=1)
        return (logits, self_cache, attention) if return_attention else (logits, self_cache)

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "num_layers": self.num_layers,
                "d_model": self.d_model, "num_heads": self.num_heads, "dff": self.dff,
                "dropout": self.dropout, "max_length": self.max_length, "encoder_length": self.encoder_length,
                "shared_embeddings": self.shared_embeddings, "copy_head": self.has_copy_head}


def copy_parts(model: Transformer, encoder_ids, decoder_inputs):
    """For a model with the copy head, teacher-forced over `decoder_inputs` (batch, len): how much of each next
    token comes from copying (the gate, (batch, len)) and from where (the copy attention, (batch, len, src_len))."""
    memory = model.encode(encoder_ids, training=False)
    x, _ = model.decode_hidden(decoder_inputs, memory, encoder_ids, training=False)
    gate, weights = model.copy_head.parts(x, model.copy_head.project_key(memory), encoder_ids,
                                          answer_positions(encoder_ids), decoder_inputs, preceding(decoder_inputs))
    return gate[..., 0], weights


def preceding(decoder_inputs):
    """Each position's token before it (batch, len): padding at the first, as a cached step sees it."""
    return ops.pad(decoder_inputs, [[0, 0], [1, 0]], constant_values=PAD_ID)[:, :-1]

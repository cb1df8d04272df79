import keras
import numpy as np
import pytest

from chatbot.model.layers import (DecoderLayer, EncoderLayer, MultiHeadAttention, PositionalEmbedding, causal_mask,
                            look_ahead_mask, padding_mask, positional_encoding)


def test_padding_mask_of_the_tutorial_example():
    mask = np.array(padding_mask(np.array([[1, 21, 777, 0, 0]])))
    assert mask.shape == (1, 1, 1, 5)
    # The tutorial marks padding with 1; ours is True where attention is allowed.
    assert (1 - mask.astype(int)).tolist() == [[[[0, 0, 0, 1, 1]]]]


def test_look_ahead_mask_combined_with_padding():
    mask = np.array(causal_mask(np.array([[1, 2, 0, 4, 0]]))).astype(int)[0, 0]
    expected = [[1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [1, 1, 0, 1, 0],
                [1, 1, 0, 1, 0]]
    assert mask.tolist() == expected
    assert np.array(look_ahead_mask(3)).astype(int)[0, 0].tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_positional_table_is_sized_by_length_not_vocabulary():
    table = positional_encoding(50, 128)
    assert table.shape == (50, 128)
    assert table[0, 0::2].tolist() == [0.0] * 64 and table[0, 1::2].tolist() == [1.0] * 64
    layer = PositionalEmbedding(vocab_size=1000, d_model=16, max_length=12)
    assert layer.table.shape == (12, 16)


def test_attention_ignores_masked_keys():
    layer = MultiHeadAttention(d_model=8, num_heads=2)
    query = np.random.default_rng(0).normal(size=(1, 3, 8)).astype("float32")
    memory = np.random.default_rng(1).normal(size=(1, 4, 8)).astype("float32")
    mask = padding_mask(np.array([[5, 6, 0, 0]]))
    out, weights = layer(query, memory, mask)
    assert out.shape == (1, 3, 8) and weights.shape == (1, 2, 3, 4)
    assert np.allclose(np.array(weights)[..., 2:], 0.0)
    changed = memory.copy()
    changed[:, 2:] += 100.0  # padding positions must not matter
    assert np.allclose(np.array(layer(query, changed, mask)[0]), np.array(out), atol=1e-5)


def _round_trip(layer, *inputs, **kwargs):
    expected = np.array(layer(*inputs, **kwargs)[0] if isinstance(layer, (MultiHeadAttention, DecoderLayer))
                        else layer(*inputs, **kwargs))
    clone = layer.__class__.from_config(layer.get_config())
    clone(*inputs, **kwargs)
    clone.set_weights(layer.get_weights())
    got = np.array(clone(*inputs, **kwargs)[0] if isinstance(clone, (MultiHeadAttention, DecoderLayer))
                   else clone(*inputs, **kwargs))
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert keras.saving.get_registered_object(keras.saving.get_registered_name(layer.__class__)) is layer.__class__


@pytest.mark.parametrize("name", ["embedding", "attention", "encoder", "decoder"])
def test_layers_serialize_with_identical_outputs(name):
    x = np.random.default_rng(0).normal(size=(2, 5, 16)).astype("float32")
    ids = np.array([[1, 2, 3, 0, 0], [4, 5, 6, 7, 8]])
    if name == "embedding":
        _round_trip(PositionalEmbedding(50, 16, 10), ids)
    elif name == "attention":
        _round_trip(MultiHeadAttention(16, 4), x, x)
    elif name == "encoder":
        _round_trip(EncoderLayer(16, 4, 32, dropout=0.1), x, padding_mask(ids))
    else:
        _round_trip(DecoderLayer(16, 4, 32, dropout=0.1), x, x, causal_mask(ids), padding_mask(ids))

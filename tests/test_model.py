import keras
import numpy as np
import pytest

from chatbot.layers import padding_mask
from chatbot.model import Transformer

ENCODER_IDS = np.array([[1, 5, 6, 7, 2, 0], [1, 9, 2, 0, 0, 0]])
DECODER_IDS = np.array([[1, 8, 9, 10, 11], [1, 12, 13, 2, 0]])


def small_model(shared_embeddings=False):
    model = Transformer(vocab_size=40, num_layers=2, d_model=16, num_heads=4, dff=32, dropout=0.1, max_length=8,
                        shared_embeddings=shared_embeddings)
    model((ENCODER_IDS, DECODER_IDS))
    return model


@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_cached_decode_matches_full_forward(shared_embeddings):
    model = small_model(shared_embeddings)
    full = np.array(model((ENCODER_IDS, DECODER_IDS), training=False))
    memory = model.encode(ENCODER_IDS)
    self_cache, cross_cache = model.init_cache(memory)
    steps = []
    for index in range(DECODER_IDS.shape[1]):
        logits, self_cache = model.decode_step(DECODER_IDS[:, index:index + 1], index, self_cache, cross_cache,
                                               padding_mask(ENCODER_IDS))
        steps.append(np.array(logits))
    np.testing.assert_allclose(np.stack(steps, axis=1)[0], full[0], atol=1e-5)
    np.testing.assert_allclose(np.stack(steps, axis=1)[1, :4], full[1, :4], atol=1e-5)  # before padding


def test_teacher_forced_decode_from_projected_memory_matches_decode_from_memory():
    """What reranking does: memory's keys and values projected once, then reused for every candidate."""
    model = small_model()
    memory, mask = model.encode(ENCODER_IDS), padding_mask(ENCODER_IDS)
    from_memory = np.array(model.decode(DECODER_IDS, memory, mask, training=False))
    projected = np.array(model.decode(DECODER_IDS, None, mask, training=False, cross_cache=model.cross_cache(memory)))
    np.testing.assert_allclose(projected, from_memory, atol=1e-6)
    assert not np.allclose(from_memory, np.array(model.decode(DECODER_IDS, memory[::-1], mask, training=False)))


@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_model_saves_and_loads_with_identical_outputs(tmp_path, shared_embeddings):
    model = small_model(shared_embeddings)
    expected = np.array(model((ENCODER_IDS, DECODER_IDS), training=False))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True, compile=False)
    assert isinstance(loaded, Transformer) and loaded.max_length == 8
    np.testing.assert_allclose(np.array(loaded((ENCODER_IDS, DECODER_IDS), training=False)), expected, atol=1e-6)


def test_mixed_precision_logits_are_float32_and_finite():
    model = Transformer(vocab_size=40, num_layers=1, d_model=16, num_heads=2, dff=32, max_length=8,
                        dtype="mixed_float16")
    logits = model((ENCODER_IDS, DECODER_IDS), training=False)
    assert logits.dtype == "float32" and np.isfinite(np.array(logits)).all()
    assert model.encoder_layers[0].attention.compute_dtype == "float16"


def test_padding_in_the_question_does_not_change_the_answer_logits():
    model = small_model()
    padded = np.array([[1, 5, 6, 7, 2, 0, 0, 0]])
    a = np.array(model((ENCODER_IDS[:1], DECODER_IDS[:1]), training=False))
    b = np.array(model((padded, DECODER_IDS[:1]), training=False))
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_shared_embeddings_make_the_output_layer_the_decoder_embedding():
    """The logits are the decoder's token embedding applied backwards: no output layer of its own."""
    shared, separate = small_model(shared_embeddings=True), small_model()
    assert shared.final_dense is None
    assert separate.count_params() - shared.count_params() == 16 * 40 + 40  # the Dense kernel and bias
    memory = shared.encode(ENCODER_IDS)
    x = np.array(shared.decode(DECODER_IDS, memory, padding_mask(ENCODER_IDS), training=False))
    embedding = np.array(shared.decoder_embedding.embedding.embeddings)
    hidden = x @ np.linalg.pinv(embedding.T)  # the decoder output that produced these logits
    np.testing.assert_allclose(hidden @ embedding.T, x, atol=1e-3)


@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_build_from_shapes_makes_every_weight_without_running_the_model(monkeypatch, shared_embeddings):
    """Loading a saved model builds it from its input shapes; running it symbolically instead cost about a
    second of every `chat -q`."""
    ran = Transformer(vocab_size=50, num_layers=2, d_model=16, num_heads=2, dff=32, max_length=8, encoder_length=12,
                      shared_embeddings=shared_embeddings)
    ran((np.ones((1, 12), "int32"), np.ones((1, 8), "int32")))
    built = Transformer(vocab_size=50, num_layers=2, d_model=16, num_heads=2, dff=32, max_length=8,
                        encoder_length=12, shared_embeddings=shared_embeddings)
    monkeypatch.setattr(Transformer, "call", lambda *args, **kwargs: pytest.fail("build ran the model"))
    built.build(((None, 12), (None, 8)))
    assert built.built and [w.shape for w in built.weights] == [w.shape for w in ran.weights]

import keras
import numpy as np
import pytest

from chatbot.model.transformer import Transformer, copy_parts
from chatbot.model.layers import answer_positions
from chatbot.tokenizer.subword import PAD_ID, SEPARATOR_ID, START_ID

ENCODER_IDS = np.array([[1, 5, 6, 7, 2, 0], [1, 9, 2, 0, 0, 0]])
DECODER_IDS = np.array([[1, 8, 9, 10, 11], [1, 12, 13, 2, 0]])
# a question, then one retrieved answer after the separator (what the copy head may copy)
WITH_ANSWER_IDS = np.array([[1, 9, 2, SEPARATOR_ID, 21, 22, 23], [1, 12, 13, 2, SEPARATOR_ID, 24, 0]])
OUTPUTS = ["dense", "shared_embeddings", "copy_head"]


def small_model(output="dense", encoder_ids=ENCODER_IDS):
    model = Transformer(vocab_size=40, num_layers=2, d_model=16, num_heads=4, dff=32, dropout=0.1, max_length=8,
                        encoder_length=8, shared_embeddings=output == "shared_embeddings",
                        copy_head=output == "copy_head")
    model((encoder_ids, DECODER_IDS))
    return model


@pytest.mark.parametrize("output", OUTPUTS)
def test_cached_decode_matches_full_forward(output):
    """Step by step with the cache, each step told the token before its own (which the copy head continues)."""
    model = small_model(output, WITH_ANSWER_IDS)
    full = np.array(model((WITH_ANSWER_IDS, DECODER_IDS), training=False))
    memory = model.encode(WITH_ANSWER_IDS)
    self_cache, cross_cache = model.init_cache(memory)
    steps = []
    for index in range(DECODER_IDS.shape[1]):
        before = DECODER_IDS[:, index - 1:index] if index else np.zeros_like(DECODER_IDS[:, :1])
        logits, self_cache = model.decode_step(DECODER_IDS[:, index:index + 1], index, self_cache, cross_cache,
                                               WITH_ANSWER_IDS, before)
        steps.append(np.array(logits))
    np.testing.assert_allclose(np.stack(steps, axis=1)[0], full[0], atol=1e-5)
    np.testing.assert_allclose(np.stack(steps, axis=1)[1, :4], full[1, :4], atol=1e-5)  # before padding


def test_teacher_forced_decode_from_projected_memory_matches_decode_from_memory():
    """What reranking does: memory's keys and values projected once, then reused for every candidate."""
    model = small_model()
    memory = model.encode(ENCODER_IDS)
    from_memory = np.array(model.decode(DECODER_IDS, memory, ENCODER_IDS, training=False))
    projected = np.array(model.decode(DECODER_IDS, None, ENCODER_IDS, training=False,
                                      cross_cache=model.cross_cache(memory)))
    np.testing.assert_allclose(projected, from_memory, atol=1e-6)
    assert not np.allclose(from_memory, np.array(model.decode(DECODER_IDS, memory[::-1], ENCODER_IDS, training=False)))


@pytest.mark.parametrize("output", OUTPUTS)
def test_model_saves_and_loads_with_identical_outputs(tmp_path, output):
    model = small_model(output, WITH_ANSWER_IDS)
    expected = np.array(model((WITH_ANSWER_IDS, DECODER_IDS), training=False))
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True, compile=False)
    assert isinstance(loaded, Transformer) and loaded.max_length == 8
    assert (loaded.copy_head is not None) == (output == "copy_head")
    np.testing.assert_allclose(np.array(loaded((WITH_ANSWER_IDS, DECODER_IDS), training=False)), expected, atol=1e-6)


def test_copy_head_gives_log_probabilities_that_may_copy_only_the_retrieved_answer():
    model = small_model("copy_head", WITH_ANSWER_IDS)
    memory = model.encode(WITH_ANSWER_IDS)
    x, _ = model.decode_hidden(DECODER_IDS, memory, WITH_ANSWER_IDS)
    log_probs = np.array(model.decode(DECODER_IDS, memory, WITH_ANSWER_IDS, training=False))
    np.testing.assert_allclose(np.exp(log_probs).sum(-1), 1.0, atol=1e-4)
    ratio = np.exp(log_probs) / np.array(keras.ops.softmax(model.logits(x)))
    # the vocabulary distribution scaled by (1 - gate), plus copy mass on the answer's tokens only
    answer_tokens = {0: [21, 22, 23], 1: [24]}
    for row, tokens in answer_tokens.items():
        others = np.delete(ratio[row], tokens, axis=-1)  # every token the answer does not hold
        np.testing.assert_allclose(others, np.repeat(others[:, :1], others.shape[1], axis=1), rtol=1e-3)
        assert (others[:, 0] < 1).all() and (ratio[row][:, tokens] > others[:, :1] * 1.0001).all()


def test_copy_head_without_a_retrieved_answer_is_the_plain_softmax():
    model = small_model("copy_head")
    memory = model.encode(ENCODER_IDS)
    x, _ = model.decode_hidden(DECODER_IDS, memory, ENCODER_IDS)
    log_probs = np.array(model.decode(DECODER_IDS, memory, ENCODER_IDS, training=False))
    np.testing.assert_allclose(np.exp(log_probs), np.array(keras.ops.softmax(model.logits(x))), atol=1e-6)


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
    shared, separate = small_model("shared_embeddings"), small_model()
    assert shared.final_dense is None
    assert separate.count_params() - shared.count_params() == 16 * 40 + 40  # the Dense kernel and bias
    memory = shared.encode(ENCODER_IDS)
    x = np.array(shared.decode(DECODER_IDS, memory, ENCODER_IDS, training=False))
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


def test_copy_head_marks_the_source_positions_that_continue_what_the_reply_wrote():
    model = small_model("copy_head", WITH_ANSWER_IDS)
    copyable = np.array(answer_positions(WITH_ANSWER_IDS))
    written = np.array([[START_ID, 21, 22, 9], [START_ID, 24, 0, 0]])
    before = np.array([[PAD_ID, START_ID, 21, 22], [PAD_ID, START_ID, 24, 0]])
    one, two = (np.array(f) for f in model.copy_head.continues(WITH_ANSWER_IDS, copyable, written, before))
    # row 0's answer is 21 22 23 at positions 4-6: the start continues at 4, 21 at 5, 22 at 6; 9 is the question's
    assert [list(np.flatnonzero(one[0, t])) for t in range(4)] == [[4], [5], [6], []]
    assert [list(np.flatnonzero(two[0, t])) for t in range(4)] == [[], [5], [6], []]
    assert [list(np.flatnonzero(one[1, t])) for t in range(2)] == [[5], []]  # 24 ends row 1's answer



def test_copy_parts_are_the_gate_and_attention_the_reply_mixes():
    model = small_model("copy_head", WITH_ANSWER_IDS)
    gate, weights = (np.array(part) for part in copy_parts(model, WITH_ANSWER_IDS, DECODER_IDS))
    assert gate.shape == DECODER_IDS.shape and ((gate > 0) & (gate < 1)).all()
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
    assert np.abs(weights[:, :, ~np.array(answer_positions(WITH_ANSWER_IDS))[0]][0]).max() < 1e-6  # row 0's question
    memory = model.encode(WITH_ANSWER_IDS)
    x, _ = model.decode_hidden(DECODER_IDS, memory, WITH_ANSWER_IDS)
    copy = np.einsum("bqk,bkv->bqv", weights, np.eye(40)[WITH_ANSWER_IDS])
    mixed = (1 - gate[..., None]) * np.array(keras.ops.softmax(model.logits(x))) + gate[..., None] * copy
    np.testing.assert_allclose(np.exp(np.array(model((WITH_ANSWER_IDS, DECODER_IDS)))), mixed + 1e-9, atol=1e-5)

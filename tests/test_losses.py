import keras
import numpy as np
import pytest

from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy


def test_loss_ignores_padding():
    targets = np.array([[5, 6, 0, 0]])
    logits = np.random.default_rng(0).normal(size=(1, 4, 10)).astype("float32")
    loss = MaskedSparseCrossEntropy()
    changed = logits.copy()
    changed[0, 2:] = np.random.default_rng(1).normal(size=(2, 10)) * 50  # garbage at padding
    assert float(loss(targets, logits)) == pytest.approx(float(loss(targets, changed)), rel=1e-6)
    per_token = keras.losses.sparse_categorical_crossentropy(targets[0, :2], logits[0, :2], from_logits=True)
    assert float(loss(targets, logits)) == pytest.approx(float(np.mean(per_token)), rel=1e-5)


def test_short_answers_weigh_as_much_as_long_ones():
    loss = MaskedSparseCrossEntropy()
    uniform = np.zeros((2, 4, 10), dtype="float32")  # every token costs log(10)
    assert float(loss(np.array([[3, 0, 0, 0], [3, 4, 5, 6]]), uniform)) == pytest.approx(np.log(10), rel=1e-5)


def test_label_smoothing_raises_loss_of_confident_predictions():
    targets = np.array([[1, 2]])
    logits = np.array([[[0, 20, 0], [0, 0, 20]]], dtype="float32")
    assert float(MaskedSparseCrossEntropy(0.1)(targets, logits)) > float(MaskedSparseCrossEntropy()(targets, logits)) + 0.5


def test_masked_accuracy_counts_only_real_tokens():
    metric = MaskedAccuracy()
    targets = np.array([[1, 2, 0, 0]])
    logits = np.eye(3, dtype="float32")[[1, 0, 0, 0]][None]  # right, wrong, (pad), (pad)
    metric.update_state(targets, logits)
    assert float(metric.result()) == pytest.approx(0.5)


def test_loss_serializes():
    loss = keras.losses.deserialize(keras.losses.serialize(MaskedSparseCrossEntropy(0.2)))
    assert loss.label_smoothing == 0.2

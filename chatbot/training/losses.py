"""Training objective and its metric, both serializable.

Owns: the masked cross-entropy averaged over real (non-pad) tokens with optional label
smoothing, and masked token accuracy.
Must not know about data, nor how the weights are updated (that is `chatbot.training.optimizer`).
"""

from __future__ import annotations

import keras
from keras import ops

from chatbot.model.layers import register


@register
class MaskedSparseCrossEntropy(keras.losses.Loss):
    """Cross-entropy of float32 logits against int targets, averaged over positions where target != 0.

    Averaging over real tokens (not every position) keeps short answers from weighing less.
    """

    def __init__(self, label_smoothing=0.0, name="masked_cross_entropy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.label_smoothing = label_smoothing

    def call(self, y_true, y_pred):
        y_true = ops.cast(y_true, "int32")
        logits = ops.cast(y_pred, "float32")
        if self.label_smoothing:
            one_hot = ops.one_hot(y_true, ops.shape(logits)[-1])
            per_token = keras.losses.categorical_crossentropy(one_hot, logits, from_logits=True,
                                                              label_smoothing=self.label_smoothing)
        else:
            per_token = keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)
        mask = ops.cast(ops.not_equal(y_true, 0), "float32")
        # Per position, weighted so that Keras' "sum_over_batch_size" reduction (sum / positions) gives the
        # mean over real tokens. Not a scalar: Keras leaves a scalar loss unscaled under a distribution
        # strategy, so with N replicas the gradients and the reported loss came out N times too large.
        return per_token * mask * (ops.cast(ops.size(mask), "float32") / ops.maximum(ops.sum(mask), 1.0))

    def get_config(self):
        return {**super().get_config(), "label_smoothing": self.label_smoothing}


@register
class MaskedAccuracy(keras.metrics.Metric):
    """Share of real (non-pad) target tokens whose arg-max prediction is right, over the epoch."""

    def __init__(self, name="masked_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = ops.cast(y_true, "int32")
        mask = ops.not_equal(y_true, 0)
        hits = ops.logical_and(mask, ops.equal(ops.cast(ops.argmax(y_pred, axis=-1), "int32"), y_true))
        self.correct.assign_add(ops.sum(ops.cast(hits, "float32")))
        self.total.assign_add(ops.sum(ops.cast(mask, "float32")))

    def result(self):
        return self.correct / ops.maximum(self.total, 1.0)

    def reset_state(self):
        self.correct.assign(0.0)
        self.total.assign(0.0)

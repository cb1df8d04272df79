"""Training objective and learning-rate schedule, all serializable.

Owns: the masked cross-entropy averaged over real (non-pad) tokens with optional label
smoothing, masked token accuracy, the warmup schedule of "Attention Is All You Need", and the
Adam that applies it in one fused kernel per variable.
Must not know about data.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from chatbot.layers import register


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


@register
class WarmupSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5), with steps counted from 1.

    With `peak_learning_rate` the same shape (linear warmup, then decay with 1/sqrt(step)) peaks at
    that value instead of at d_model^-0.5 * warmup_steps^-0.5, so warmup length and peak are set apart:
    a short warmup no longer means a peak high enough to collapse the post-LN encoder.
    """

    def __init__(self, d_model, warmup_steps=4000, peak_learning_rate=None):
        self.d_model, self.warmup_steps, self.peak_learning_rate = d_model, warmup_steps, peak_learning_rate

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0  # the optimizer counts from 0
        warmup = ops.cast(self.warmup_steps, "float32")
        shape = ops.minimum(ops.rsqrt(step), step * warmup ** -1.5)  # peaks at warmup^-0.5
        if self.peak_learning_rate is None:
            return ops.rsqrt(ops.cast(self.d_model, "float32")) * shape
        return self.peak_learning_rate * ops.sqrt(warmup) * shape

    def get_config(self):
        return {"d_model": self.d_model, "warmup_steps": self.warmup_steps,
                "peak_learning_rate": self.peak_learning_rate}


@register
class FusedAdam(keras.optimizers.Adam):
    """Keras' Adam, with each variable's update done by TensorFlow's fused kernel (`ResourceApplyAdam`).

    The same arithmetic as `keras.optimizers.Adam`, which Keras 3 writes as about ten element-wise ops per
    variable, each a pass over the variable: about a tenth of a CPU training step of this model. An
    embedding's sparse gradient is summed into a dense one first, as textbook Adam (and Keras 2) reads
    it; Keras 3 applies its rows one by one, so a token twice in a batch got each repeat squared apart in
    the second moment. AMSGrad falls back to Keras' own update.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        index = self._get_variable_index(variable)

        def handle(var):  # the tf.Variable under a Keras variable (on this replica, under a distribution)
            return (var.value if isinstance(var, keras.Variable) else var).handle

        def scalar(value):
            return tf.cast(value, variable.dtype)

        step = scalar(self.iterations + 1)
        tf.raw_ops.ResourceApplyAdam(
            var=handle(variable), m=handle(self._momentums[index]), v=handle(self._velocities[index]),
            beta1_power=tf.pow(scalar(self.beta_1), step), beta2_power=tf.pow(scalar(self.beta_2), step),
            lr=scalar(learning_rate), beta1=scalar(self.beta_1), beta2=scalar(self.beta_2), epsilon=scalar(self.epsilon),
            grad=scalar(tf.convert_to_tensor(gradient)))  # an embedding's sparse gradient: repeated rows summed


def transformer_optimizer(d_model, warmup_steps=4000, peak_learning_rate=None) -> FusedAdam:
    """Adam(beta_1=0.9, beta_2=0.98, epsilon=1e-9) on the warmup schedule, as in the paper."""
    return FusedAdam(WarmupSchedule(d_model, warmup_steps, peak_learning_rate), beta_1=0.9, beta_2=0.98,
                     epsilon=1e-9)

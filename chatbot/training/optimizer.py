"""How the weights are updated: the learning-rate schedule and the optimizer, both serializable.

Owns: the warmup schedule of "Attention Is All You Need" (optionally peaking at a set learning rate),
the Adam that applies it in one fused kernel per variable, and `transformer_optimizer`, the two
together with the paper's settings. Both are registered as "chatbot>" and their class name: a saved
configuration finds them by that name, whichever module it says they came from.
Must not know about data, the model or the loss.
"""

from __future__ import annotations

import keras
from keras import ops

from chatbot.model.layers import register


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
    the second moment. AMSGrad, and any Keras backend but TensorFlow, fall back to Keras' own update.
    """

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad or keras.backend.backend() != "tensorflow":  # JAX and PyTorch: Keras' own arithmetic
            return super().update_step(gradient, variable, learning_rate)
        import tensorflow as tf

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

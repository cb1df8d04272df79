"""`WorkerFit`: the Keras `fit` of one model, made to work under MultiWorkerMirroredStrategy.

Owns: two work-arounds for Keras 3 with TensorFlow's multi-worker strategy, kept apart from the model's
architecture: `train` mixes it into the model it fits (`train.FittedTransformer`), and the model a directory
saves is a plain `Transformer`. Must not know about the model's layers.
"""

from __future__ import annotations

import keras
from keras import ops


class WorkerFit(keras.Model):
    """A `keras.Model` whose compiled loss and metrics can be built before `fit` (`build_compiled`), and whose
    logs reduce across machines."""

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        """Keras builds the compiled loss and metrics from a first batch averaged across replicas, which
        MultiWorkerMirroredStrategy cannot do for integer batches; `train` builds them before `fit`
        (`build_compiled`), and then there is nothing left to build."""
        if self._compile_loss is not None and self._compile_loss.built and (
                self._compile_metrics is None or self._compile_metrics.built):
            return
        super()._maybe_symbolic_build(iterator, data_batch)

    def train_step(self, data):
        return self._for_workers(super().train_step(data))

    def test_step(self, data):
        return self._for_workers(super().test_step(data))

    def _for_workers(self, logs: dict) -> dict:
        """Across machines (MultiWorkerMirroredStrategy), Keras averages each worker's logs along axis 0,
        which a scalar lacks: there, each log is a vector of one."""
        extended = getattr(getattr(self, "_distribute_strategy", None), "extended", None)
        if extended is not None and getattr(extended, "_in_multi_worker_mode", lambda: False)():
            return {name: ops.reshape(value, (1,)) for name, value in logs.items()}
        return logs

    def build_compiled(self, batch) -> None:
        """Build the compiled loss and metrics from one (inputs, targets) batch of this process."""
        self._symbolic_build(data_batch=batch)

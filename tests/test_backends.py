"""The network on any Keras backend: the model, its loss, schedule and optimizer train under JAX, and the weights
trained there give the TensorFlow model the same logits (so a GPU run through JAX chats here)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT

# Runs under KERAS_BACKEND=jax in a fresh interpreter: a few training steps on fixed arrays, then the weights
# and the logits of the trained model on one batch.
TRAIN_UNDER_JAX = """
import json, sys
import numpy as np
import keras
from chatbot.config import ModelConfig
from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from chatbot.model.transformer import Transformer
from chatbot.training.optimizer import transformer_optimizer
assert keras.backend.backend() == "jax"
assert not [name for name in sys.modules if name.startswith("tensorflow") and name.split(".")[0] == "tensorflow"
            and "chatbot" in getattr(sys.modules[name], "__file__", "")]
config = ModelConfig(**json.loads(sys.argv[1]))
arrays = np.load(sys.argv[2])
keras.utils.set_random_seed(0)
model = Transformer.from_config_dataclass(config)
model.compile(optimizer=transformer_optimizer(config.d_model, 10), loss=MaskedSparseCrossEntropy(0.1),
              metrics=[MaskedAccuracy()], jit_compile=True)
history = model.fit((arrays["encoder"], arrays["decoder"]), arrays["targets"], batch_size=8, epochs=3, verbose=0)
model.save_weights(sys.argv[3])
logits = keras.ops.convert_to_numpy(model((arrays["encoder"][:4], arrays["decoder"][:4]), training=False))
np.save(sys.argv[4], logits)
print(json.dumps(history.history["loss"]))
"""

CONFIG = {"vocab_size": 64, "num_layers": 1, "d_model": 16, "num_heads": 2, "dff": 32, "dropout": 0.0,
          "max_length": 8, "encoder_length": 16, "copy_head": True}


def training_arrays(path):
    """Encoder inputs with a separator and a retrieved answer (for the copy head), teacher-forced decoder rows."""
    rng = np.random.default_rng(0)
    encoder = rng.integers(8, 64, (32, 16)).astype("int32")
    encoder[:, 0], encoder[:, 5], encoder[:, 6], encoder[:, 14:] = 1, 2, 4, 0
    decoder = np.concatenate([np.ones((32, 1), "int32"), encoder[:, 7:14]], axis=1)
    targets = np.concatenate([decoder[:, 1:], np.full((32, 1), 2, "int32")], axis=1)
    np.savez(path, encoder=encoder, decoder=decoder, targets=targets)
    return encoder, decoder


@pytest.mark.slow  # a JAX subprocess compiles its training step
def test_weights_trained_under_jax_give_the_tensorflow_model_the_same_logits(tmp_path):
    pytest.importorskip("jax")
    import tensorflow as tf  # noqa: F401  (the TensorFlow backend, as in the rest of the suite)

    from chatbot.config import ModelConfig
    from chatbot.model.transformer import Transformer

    encoder, decoder = training_arrays(tmp_path / "arrays.npz")
    weights, logits = tmp_path / "jax.weights.h5", tmp_path / "logits.npy"
    run = subprocess.run([sys.executable, "-c", TRAIN_UNDER_JAX, json.dumps(CONFIG), str(tmp_path / "arrays.npz"),
                          str(weights), str(logits)], capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env={**os.environ, "KERAS_BACKEND": "jax", "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    assert run.returncode == 0, run.stderr[-3000:]
    losses = json.loads(run.stdout.splitlines()[-1])
    assert losses[-1] < losses[0]  # it trained

    model = Transformer.from_config_dataclass(ModelConfig(**CONFIG))
    model((encoder[:1], decoder[:1]))
    model.load_weights(weights)
    ours = model((encoder[:4], decoder[:4]), training=False).numpy()
    assert np.allclose(ours, np.load(logits), atol=1e-4), np.abs(ours - np.load(logits)).max()


def test_the_networks_modules_import_no_tensorflow():
    """What defines and trains the network reads only Keras, so it runs where TensorFlow is not installed."""
    script = ("import sys\nimport chatbot.model.transformer, chatbot.training.losses, chatbot.training.optimizer, chatbot.training.sizing, chatbot.tokenizer.special, "
              "chatbot.model.sentence\n"
              "print(sorted(n for n in sys.modules if n == 'tensorflow' or n.startswith('tensorflow.')))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT,
                         env={**os.environ, "KERAS_BACKEND": "numpy", "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"

"""Crisis by meaning: a small classifier on multilingual-e5-small's sentence embeddings that recognises a message
signalling suicide risk, self-harm or abuse when it says so in words `chatbot.safety.keywords`'s list does not hold
("약 한 달치 모아놨어", "집 가면 또 맞겠지"). It runs beside the list, never instead of it: the list is read
first, the classifier only where the list found nothing, and a model without the pretrained encoder keeps the
list alone.

Owns: `CrisisHead` (one softmax layer over the message's e5 "query: " unit vector: none / self-harm / abuse, and
the decision rule), the shipped weights (`HEAD_FILE`, written by `python bench/crisis.py --write`, which trains
on data/safety/ and picks the threshold on its dev split), which kind of training row asks for which reply
(`KIND_CLASS`). The message reaches the head as `chatbot.data.text.question_part` of the checked text, normalised, with E5's
"query: " prefix (`chatbot.retrieval.retriever.PRETRAINED_PREFIXES[0]`): the vector `PretrainedIndex.message_vectors`
computes, before any FAQ projection.
"""

from __future__ import annotations

import io
from pathlib import Path

import keras
import numpy as np
from keras import ops

from chatbot.model.layers import register
from chatbot.safety.keywords import ABUSE_REPLY, SELF_HARM_REPLY

HEAD_FILE = Path(__file__).resolve().parent / "crisis_head.npz"
NONE, SELF_HARM, ABUSE = 0, 1, 2  # the head's classes
REPLIES = {SELF_HARM: SELF_HARM_REPLY, ABUSE: ABUSE_REPLY}  # what each crisis class gets (`chatbot.safety.keywords`'s)
CLASSES = ("none", "self_harm", "abuse")
# data/safety/crisis_positive.csv's kinds: which reply each asks for (its negatives are all NONE)
KIND_CLASS = {
    "explicit_wish": SELF_HARM, "implicit_plan": SELF_HARM, "place_height": SELF_HARM, "no_wake": SELF_HARM,
    "farewell": SELF_HARM, "hopelessness": SELF_HARM, "self_harm": SELF_HARM,
    "violence_home": ABUSE, "violence_school": ABUSE, "violence_work": ABUSE, "violence_partner": ABUSE,
    "sexual_violence": ABUSE,
}


@register
class CrisisHead(keras.layers.Layer):
    """e5 unit vectors (batch, dim) -> class probabilities (batch, 3): none, self-harm, abuse. A message is a crisis
    when p(self-harm) + p(abuse) >= `threshold` (chosen on dev so that few hard negatives pass it); its reply is
    that of the likelier of the two. One linear layer: 384 x 3 weights, nothing to overfit 2,400 rows with."""

    def __init__(self, dim: int = 384, threshold: float = 0.5, l2: float = 0.0, **kwargs):
        super().__init__(**kwargs)
        self.dim, self.threshold, self.l2 = int(dim), float(threshold), float(l2)

    def build(self, input_shape=None):
        self.kernel = self.add_weight(shape=(self.dim, len(CLASSES)), initializer="zeros", name="kernel",
                                      regularizer=keras.regularizers.L2(self.l2) if self.l2 else None)
        self.bias = self.add_weight(shape=(len(CLASSES),), initializer="zeros", name="bias")
        self.built = True

    def call(self, vectors):
        return ops.softmax(ops.matmul(ops.cast(vectors, self.kernel.dtype), self.kernel) + self.bias, axis=-1)

    def score(self, vectors):
        """(batch,) p(self-harm) + p(abuse): how likely a crisis, whichever kind."""
        return 1.0 - self(vectors)[:, NONE]

    def classes(self, vectors):
        """(batch,) int32: NONE, or SELF_HARM / ABUSE where the score reaches the threshold."""
        probabilities = self(vectors)
        kind = ops.where(probabilities[:, SELF_HARM] >= probabilities[:, ABUSE], SELF_HARM, ABUSE)
        return ops.cast(ops.where(1.0 - probabilities[:, NONE] >= self.threshold, kind, NONE), "int32")

    def get_config(self):
        return {**super().get_config(), "dim": self.dim, "threshold": self.threshold, "l2": self.l2}

    def to_bytes(self, **notes) -> bytes:
        """The weights and threshold as an .npz file's bytes (`notes`: strings or numbers kept beside them)."""
        buffer = io.BytesIO()
        np.savez(buffer, kernel=ops.convert_to_numpy(self.kernel), bias=ops.convert_to_numpy(self.bias),
                 threshold=np.float32(self.threshold), **{k: np.asarray(v) for k, v in notes.items()})
        return buffer.getvalue()


def load_head(path: str | Path = HEAD_FILE) -> CrisisHead:
    """The head saved at `path` (the shipped one by default), built and ready."""
    with np.load(path) as data:
        kernel, bias, threshold = data["kernel"], data["bias"], float(data["threshold"])
    head = CrisisHead(kernel.shape[0], threshold, name="crisis_head")
    head.build()
    head.kernel.assign(kernel.astype(np.float32))
    head.bias.assign(bias.astype(np.float32))
    return head


def fit_head(x: np.ndarray, labels: np.ndarray, seed: int = 0, epochs: int = 300, l2: float = 1e-4,
             x_dev: np.ndarray | None = None, labels_dev: np.ndarray | None = None) -> CrisisHead:
    """A head trained on unit vectors `x` (rows, dim) with `labels` in {NONE, SELF_HARM, ABUSE}: softmax
    regression, each class weighted to count as much as the others (crisis rows are the fewer), L2, Adam; with a
    dev split, stopped early on its (class-weighted) loss and its best weights kept. The threshold is left at 0.5
    for the caller to choose on dev."""
    keras.utils.set_random_seed(seed)
    head = CrisisHead(x.shape[1], l2=l2, name="crisis_head")
    inputs = keras.Input((x.shape[1],))
    model = keras.Model(inputs, head(inputs))
    counts = np.bincount(labels, minlength=len(CLASSES)).astype(np.float64)
    weights = (len(labels) / (len(CLASSES) * np.maximum(counts, 1)))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    callbacks, validation = [], None
    if x_dev is not None:
        validation = (x_dev, labels_dev, weights[labels_dev])
        callbacks = [keras.callbacks.EarlyStopping(patience=20, restore_best_weights=True)]
    model.fit(x, labels, sample_weight=weights[labels], validation_data=validation, epochs=epochs, batch_size=128,
              verbose=0, callbacks=callbacks)
    return head


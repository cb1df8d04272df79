"""What one decoding call is made of: a static `Plan` and tensor `Options`.

Owns: `Plan`, the options that shape the graph (strategy, beam width, n-gram size, candidate count, XLA or
not), made once from a checked `GenerationConfig` and used as the key of the compiled functions; and `Options`,
the options that are tensors, so changing them never recompiles. Must not check user values (that is
`GenerationConfig`'s job) nor build or run graphs (that is `chatbot.decoding`'s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import tensorflow as tf

from chatbot.config import GenerationConfig


@dataclass(frozen=True)
class Plan:
    """The static decoding options: each distinct plan is traced (and with `jit`, XLA-compiled) once."""

    strategy: str = "greedy"
    num_beams: int = 1  # more than one only for beam search
    no_repeat_ngram_size: int = 0
    candidates: int = 0  # retrieved answers weighed against the generated reply (0: the reply as decoded)
    jit: bool = False

    @classmethod
    def of(cls, settings: GenerationConfig, retrievable: int, jit: bool) -> "Plan":
        """The plan for `settings`, where `retrievable` answers can be retrieved (0 without an index)."""
        return cls(settings.strategy, settings.num_beams if settings.strategy == "beam" else 1,
                   settings.no_repeat_ngram_size, min(settings.candidates, retrievable), jit)


class Options(NamedTuple):
    """The decoding options that are tensors, so changing them never recompiles."""

    steps: tf.Tensor  # new tokens at most: max_new_tokens, capped by the model's max_length
    temperature: tf.Tensor
    top_k: tf.Tensor
    top_p: tf.Tensor
    repetition_penalty: tf.Tensor
    length_penalty: tf.Tensor
    agreement: tf.Tensor
    mbr: tf.Tensor
    seed: tf.Tensor

    @classmethod
    def of(cls, settings: GenerationConfig, max_length: int, seed: int) -> "Options":
        """The tensors for `settings`, with `seed` (drawn by the caller when the settings have none)."""
        return cls(tf.constant(min(settings.max_new_tokens, max_length)),
                   tf.constant(settings.temperature, tf.float32), tf.constant(settings.top_k),
                   tf.constant(settings.top_p, tf.float32), tf.constant(settings.repetition_penalty, tf.float32),
                   tf.constant(settings.length_penalty, tf.float32), tf.constant(settings.agreement, tf.float32),
                   tf.constant(settings.mbr, tf.float32), tf.constant(seed))


OPTIONS_SIGNATURE = Options(*(tf.TensorSpec([], dtype) for dtype in (
    tf.int32, tf.float32, tf.int32, tf.float32, tf.float32, tf.float32, tf.float32, tf.float32, tf.int32)))

"""What one decoding call is made of: the static plan, the tensor options, and a checked request.

Owns: `Plan` (the options that key a compiled function: a strategy, a beam width, a candidate count, XLA or not),
`Options` (the options that are tensors, so changing them never builds a graph) and `Request` (what the one
validation, `Chatbot.request`, hands every later stage). Must not decode or validate.
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
    candidates: int = 0  # retrieved answers weighed against the generated reply (0: the reply as decoded)
    jit: bool = False

    @classmethod
    def of(cls, settings: GenerationConfig, retrievable: int, jit: bool) -> "Plan":
        """The plan for `settings`, where `retrievable` answers can be retrieved (0 without an index)."""
        return cls(settings.strategy, settings.num_beams if settings.strategy == "beam" else 1,
                   min(settings.candidates, retrievable), jit)


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
    no_repeat_ngram_size: tf.Tensor  # 0: none

    @classmethod
    def of(cls, settings: GenerationConfig, max_length: int, seed: int) -> "Options":
        """The tensors for `settings`, with `seed` (drawn by the caller when the settings have none)."""
        return cls(tf.constant(min(settings.max_new_tokens, max_length)),
                   tf.constant(settings.temperature, tf.float32), tf.constant(settings.top_k),
                   tf.constant(settings.top_p, tf.float32), tf.constant(settings.repetition_penalty, tf.float32),
                   tf.constant(settings.length_penalty, tf.float32), tf.constant(settings.agreement, tf.float32),
                   tf.constant(settings.mbr, tf.float32), tf.constant(seed),
                   tf.constant(settings.no_repeat_ngram_size))


OPTIONS_SIGNATURE = Options(*(tf.TensorSpec([], dtype) for dtype in (
    tf.int32, tf.float32, tf.int32, tf.float32, tf.float32, tf.float32, tf.float32, tf.float32, tf.int32, tf.int32)))


class Request(NamedTuple):
    """A checked request: what `Chatbot.request` hands every later stage, which check nothing again."""

    texts: list[str]  # each question with the conversation before it (`Chatbot.with_contexts`)
    tones: list[int]  # one per question: 0-2, or -1 for none
    settings: GenerationConfig
    plan: Plan

    @staticmethod
    def joined(requests: list["Request"]) -> "Request":
        """Requests with equal settings and plans as one batch (the first one's settings and plan)."""
        head = requests[0]
        return head._replace(texts=[t for r in requests for t in r.texts], tones=[t for r in requests for t in r.tones])

"""`Chatbot`: answering questions with a trained model, fast.

Owns: cached, compiled decoding (the encoder runs once per request; each decoder step feeds one
token and reuses the key/value cache; the whole reply is one `tf.function` with a while loop),
greedy / beam / sampling strategies, streaming, batches, attention maps, and the naive
full-recompute greedy decoder kept as the test oracle. Must not touch Gradio.
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from chatbot.artifacts import load_model_dir
from chatbot.config import ChatbotConfig, GenerationConfig
from chatbot.layers import padding_mask
from chatbot.pipeline import encoder_inputs
from chatbot.samplers import BeamSampler, GreedySampler, TopKTopPSampler, process_logits, suppress_special
from chatbot.tokenizer import END_ID, PAD_ID, START_ID, Tokenizer


class Options(NamedTuple):
    """The decoding options that are tensors, so changing them never recompiles."""

    max_new_tokens: tf.Tensor
    temperature: tf.Tensor
    top_k: tf.Tensor
    top_p: tf.Tensor
    repetition_penalty: tf.Tensor
    length_penalty: tf.Tensor
    seed: tf.Tensor


OPTIONS_SIGNATURE = Options(*(tf.TensorSpec([], dtype) for dtype in (
    tf.int32, tf.float32, tf.int32, tf.float32, tf.float32, tf.float32, tf.int32)))


class State(NamedTuple):
    """The loop state of greedy and sampling decoding."""

    index: tf.Tensor  # position of the last written token
    tokens: tf.Tensor  # (batch, max_length + 1): start token, reply, padding
    finished: tf.Tensor  # (batch,) bool
    seen: tf.Tensor  # (batch, vocab) bool: tokens already in the reply
    self_cache: tf.Tensor
    cross_cache: tf.Tensor
    memory_mask: tf.Tensor


class Decoder:
    """Compiled decoding over one model and tokenizer, shared by `Chatbot` and the SavedModel export."""

    def __init__(self, model, tokenizer: Tokenizer, jit_compile: bool = False):
        self.model, self.tokenizer = model, tokenizer
        self.max_length = model.max_length
        self.jit_compile = jit_compile
        self._compiled = {}

    # -- pieces --------------------------------------------------------------------------
    def encode_texts(self, texts):
        """Strings (batch,) -> encoder ids (batch, src_len) padded with 0, all in the graph."""
        return encoder_inputs(self.tokenizer.tokenize(texts), self.max_length).to_tensor()

    def start(self, encoder_ids) -> State:
        memory = self.model.encode(encoder_ids, training=False)
        self_cache, cross_cache = self.model.init_cache(memory)
        batch = tf.shape(encoder_ids)[0]
        tokens = tf.concat([tf.fill([batch, 1], START_ID),
                            tf.fill([batch, self.max_length], PAD_ID)], axis=1)
        return State(tf.constant(0), tokens, tf.zeros([batch], tf.bool),
                     tf.zeros([batch, self.model.vocab_size], tf.bool), self_cache, cross_cache,
                     padding_mask(encoder_ids))

    def step(self, state: State, options: Options, sampler, no_repeat_ngram_size: int) -> State:
        """Feed the last token, choose the next one, write it at index + 1."""
        last = tf.gather(state.tokens, [state.index], axis=1)
        logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                    state.memory_mask)
        logits = process_logits(logits, state.tokens, state.index, state.seen, options.repetition_penalty,
                                no_repeat_ngram_size)
        chosen = tf.where(state.finished, PAD_ID, sampler.next(logits, state.index, options))
        tokens = _write(state.tokens, state.index + 1, chosen)
        seen = state.seen | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
        return state._replace(index=state.index + 1, tokens=tokens, finished=state.finished | (chosen == END_ID),
                              seen=seen, self_cache=self_cache)

    def steps_allowed(self, options: Options):
        return tf.minimum(options.max_new_tokens, self.max_length)

    # -- whole replies, compiled -----------------------------------------------------------
    def sample_loop(self, texts, options: Options, sampler, no_repeat_ngram_size: int):
        state = self.start(self.encode_texts(texts))
        limit = self.steps_allowed(options)
        state = tf.while_loop(
            lambda s: (s.index < limit) & ~tf.reduce_all(s.finished),
            lambda s: (self.step(s, options, sampler, no_repeat_ngram_size),),
            (state,), maximum_iterations=self.max_length)[0]
        return state.tokens[:, 1:]

    def beam_loop(self, texts, options: Options, num_beams: int, no_repeat_ngram_size: int):
        encoder_ids = tf.repeat(self.encode_texts(texts), num_beams, axis=0)  # (batch*beams, src_len)
        state = self.start(encoder_ids)
        batch = tf.shape(encoder_ids)[0] // num_beams
        scores = tf.tile(tf.concat([[0.0], tf.fill([num_beams - 1], -1e9)], 0)[None], [batch, 1])
        sampler = BeamSampler(num_beams)
        limit = self.steps_allowed(options)

        def body(state, scores):
            last = tf.gather(state.tokens, [state.index], axis=1)
            logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                        state.memory_mask)
            logits = process_logits(logits, state.tokens, state.index, state.seen, options.repetition_penalty,
                                    no_repeat_ngram_size)
            scores, parent, chosen = sampler.next(tf.nn.log_softmax(logits), scores, state.finished)
            rows = tf.reshape(parent + tf.range(batch)[:, None] * num_beams, [-1])  # reorder beams
            chosen = tf.reshape(chosen, [-1])
            reorder = lambda t: tf.gather(t, rows)  # noqa: E731
            tokens = _write(reorder(state.tokens), state.index + 1, chosen)
            finished = reorder(state.finished) | (chosen == END_ID)
            seen = reorder(state.seen) | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
            state = state._replace(index=state.index + 1, tokens=tokens, finished=finished, seen=seen,
                                   self_cache=reorder(self_cache))
            return state, scores

        state, scores = tf.while_loop(lambda s, _: (s.index < limit) & ~tf.reduce_all(s.finished), body,
                                      (state, scores), maximum_iterations=self.max_length)
        replies = tf.reshape(state.tokens[:, 1:], [batch, num_beams, -1])
        lengths = tf.reduce_sum(tf.cast(replies != PAD_ID, tf.float32), axis=-1)
        normalised = scores / tf.maximum(lengths, 1.0) ** options.length_penalty
        return tf.gather(replies, tf.argmax(normalised, axis=-1, output_type=tf.int32), batch_dims=1)

    def generate_ids(self, texts, options: Options, strategy="greedy", num_beams=4, no_repeat_ngram_size=0):
        """Reply ids (batch, max_length), padded after the end token, from one compiled call per
        (strategy, beam width, n-gram size)."""
        key = (strategy, num_beams if strategy == "beam" else 0, no_repeat_ngram_size)
        if key not in self._compiled:
            if strategy == "beam":
                fn = lambda t, o: self.beam_loop(t, o, num_beams, no_repeat_ngram_size)  # noqa: E731
            else:
                sampler = TopKTopPSampler() if strategy == "sample" else GreedySampler()
                fn = lambda t, o: self.sample_loop(t, o, sampler, no_repeat_ngram_size)  # noqa: E731
            self._compiled[key] = tf.function(fn, jit_compile=self.jit_compile, input_signature=[
                tf.TensorSpec([None], tf.string), OPTIONS_SIGNATURE])
        return self._compiled[key](tf.constant(texts, tf.string), options)


def _write(tokens, position, values):
    """tokens[:, position] = values, in a form XLA compiles (no dynamic scatter)."""
    column = tf.range(tf.shape(tokens)[1])[None] == position
    return tf.where(column, values[:, None], tokens)


class Chatbot:
    """A trained model ready to answer. Decoding options: see `GenerationConfig`."""

    def __init__(self, model, tokenizer: Tokenizer, config: ChatbotConfig, path: str | Path | None = None):
        self.model, self.tokenizer, self.config, self.path = model, tokenizer, config, path
        self.decoder = Decoder(model, tokenizer)
        self._step = {}

    @classmethod
    def load(cls, path: str | Path) -> "Chatbot":
        config, tokenizer, model = load_model_dir(path)
        return cls(model, tokenizer, config, path)

    def options(self, **decoding) -> tuple[GenerationConfig, Options]:
        settings = GenerationConfig(**decoding)
        seed = settings.seed if settings.seed is not None else random.randrange(2**31 - 1)
        return settings, Options(
            tf.constant(settings.max_new_tokens), tf.constant(settings.temperature, tf.float32),
            tf.constant(settings.top_k), tf.constant(settings.top_p, tf.float32),
            tf.constant(settings.repetition_penalty, tf.float32), tf.constant(settings.length_penalty, tf.float32),
            tf.constant(seed))

    def reply_ids(self, texts: list[str], **decoding) -> np.ndarray:
        settings, options = self.options(**decoding)
        return self.decoder.generate_ids(list(texts), options, settings.strategy, settings.num_beams,
                                         settings.no_repeat_ngram_size).numpy()

    def reply_batch(self, texts: list[str], **decoding) -> list[str]:
        if not texts:
            return []
        return self.tokenizer.decode(_trim(self.reply_ids(texts, **decoding)))

    def reply(self, text: str, **decoding) -> str:
        return self.reply_batch([text], **decoding)[0]

    def stream(self, text: str, **decoding) -> Iterator[str]:
        """Yield the growing reply, one token at a time (each step is one compiled call)."""
        settings, options = self.options(**decoding)
        if settings.strategy == "beam":  # beams are only ranked at the end: decode, then reveal
            ids = _trim(self.reply_ids([text], **decoding))[0]
            for end in range(1, len(ids) + 1):
                yield self.tokenizer.decode([ids[:end]])[0]
            return
        key = (settings.strategy, settings.no_repeat_ngram_size)
        if key not in self._step:
            sampler = TopKTopPSampler() if settings.strategy == "sample" else GreedySampler()
            self._step[key] = tf.function(lambda s, o: self.decoder.step(s, o, sampler, settings.no_repeat_ngram_size))
        state = self.decoder.start(self.decoder.encode_texts(tf.constant([text])))
        previous = ""
        for _ in range(min(settings.max_new_tokens, self.decoder.max_length)):
            state = self._step[key](state, options)
            if bool(state.finished[0]):
                break
            current = self.tokenizer.decode(_trim(state.tokens[:, 1:].numpy()))[0]
            if current != previous:
                previous = current
                yield current
        if not previous:
            yield ""

    def attention(self, text: str, reply: str | None = None) -> dict:
        """Cross-attention of a reply over the question: tokens and weights (layers, heads, reply, question)."""
        encoder_ids = self.decoder.encode_texts(tf.constant([text]))
        reply_ids = _trim(self.reply_ids([text]))[0] if reply is None else self.tokenizer.encode([reply])[0]
        decoder_ids = tf.constant([[START_ID, *reply_ids]], tf.int32)
        memory = self.model.encode(encoder_ids, training=False)
        _, attention = self.model.decode(decoder_ids, memory, padding_mask(encoder_ids), return_attention=True)
        weights = np.stack([w[0].numpy() for w in attention])  # (layers, heads, reply+1, question)
        return {"reply": self.tokenizer.decode([reply_ids])[0],
                "question_tokens": self.tokenizer.pieces(encoder_ids[0].numpy()),
                "reply_tokens": self.tokenizer.pieces([*reply_ids, END_ID]),
                "weights": weights}

    def naive_reply(self, text: str, max_new_tokens: int = 40) -> str:
        """Greedy decoding the seed tutorial's way: re-run the encoder and the whole decoder prefix
        for every new token. Slow on purpose; the oracle the cached decoder is tested against."""
        encoder_ids = self.decoder.encode_texts(tf.constant([text]))
        output = [START_ID]
        for _ in range(min(max_new_tokens, self.decoder.max_length)):
            logits = self.model((encoder_ids, tf.constant([output], tf.int32)), training=False)[:, -1]
            token = int(tf.argmax(suppress_special(logits, len(output) - 1), axis=-1)[0])
            if token == END_ID:
                break
            output.append(token)
        return self.tokenizer.decode([output[1:]])[0]


def _trim(ids) -> list[list[int]]:
    """Cut each row of reply ids at its end token."""
    rows = []
    for row in np.asarray(ids).tolist():
        rows.append(row[:row.index(END_ID)] if END_ID in row else [t for t in row if t != PAD_ID])
    return rows

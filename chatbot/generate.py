"""`Chatbot`: answering questions with a trained model, fast.

Owns: the Python API over the compiled decoder (`chatbot.decoding.CachedDecoder`: the encoder runs
once per request, each step feeds one token and reuses the key/value cache, the whole reply is one
XLA-compiled loop): checking questions, tones and options, replies and batches, streaming, warm-up,
attention maps, and the naive full-recompute greedy decoder kept as the test oracle.
Must not touch Gradio.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from chatbot.artifacts import load_model_dir
from chatbot.config import TONES, ChatbotConfig, GenerationConfig
from chatbot.compiled import CompiledCache
from chatbot.decoding import BATCH_BUCKETS, COMPILED_KEPT, CachedDecoder, Options
from chatbot.samplers import sampler_for, suppress_special
from chatbot.text import check_questions
from chatbot.tokenizer import END_ID, PAD_ID, START_ID, Tokenizer


class Chatbot:
    """A trained model ready to answer. Decoding options: see `GenerationConfig`. With `jit_compile=False`
    the same decoding loop runs as a plain graph: no XLA compilation per batch and encoder-length shape
    (seconds each on a CPU) but slower replies; for tests and one-off scripts."""

    def __init__(self, model, tokenizer: Tokenizer, config: ChatbotConfig, path: str | Path | None = None,
                 retriever=None, jit_compile: bool = True):
        self.model, self.tokenizer, self.config, self.path = model, tokenizer, config, path
        self.retriever = retriever
        self.decoder = CachedDecoder(model, tokenizer, config.context, retriever, jit_compile, config.rerank)
        self._step = CompiledCache(COMPILED_KEPT)  # streaming: one traced step per (strategy, n-gram size)
        self._start = tf.function(self.decoder.start, autograph=False)
        self._encode = tf.function(self.decoder.encode_texts, autograph=False)
        self._seeds = random.Random()  # its own: code that reseeds Python's `random` (training) leaves it alone
        self._answer_rows = None  # training answer -> its rows in the retrieval index, built on first `provenance`

    @classmethod
    def load(cls, path: str | Path, jit_compile: bool = True) -> "Chatbot":
        config, tokenizer, model, retriever = load_model_dir(path)
        return cls(model, tokenizer, config, path, retriever, jit_compile)

    @property
    def has_tone(self) -> bool:
        """Whether the model learned tone tokens (its training data had a label column)."""
        return self.config.context.tone

    def tone_ids(self, tone, count: int) -> list[int]:
        """A tone (None, 0/1/2 or everyday/sad/love) as the int the graph takes, once per question.
        A model that learned no tones ignores it. Raises ValueError for anything else."""
        if tone is None or tone == "":
            return [-1] * count
        if isinstance(tone, str) and tone in TONES:
            tone = TONES.index(tone)
        if isinstance(tone, bool) or not isinstance(tone, int) or tone not in range(len(TONES)):
            raise ValueError(f"tone must be one of {', '.join(TONES)} (or 0-2), got {tone!r}")
        return [tone if self.has_tone else -1] * count

    def settings(self, **decoding) -> GenerationConfig:
        """Checked settings. Raises ValueError for an option out of bounds or past this model's max_length."""
        settings = GenerationConfig(**decoding)
        if settings.no_repeat_ngram_size > self.decoder.max_length:
            raise ValueError(f"no_repeat_ngram_size must be 0 or 2..{self.decoder.max_length} (this model's "
                             f"max_length), got {settings.no_repeat_ngram_size}")
        return settings

    def options(self, **decoding) -> tuple[GenerationConfig, Options]:
        """Checked settings and their tensors. Raises ValueError for an option out of bounds, always
        before any compiled call, so a bad request never leaves decoding half-done."""
        settings = self.settings(**decoding)
        seed = settings.seed if settings.seed is not None else self._seeds.randrange(2**31 - 1)
        steps = self.decoder.step_limit(settings.max_new_tokens)
        return settings, Options(
            tf.constant(steps), tf.constant(settings.temperature, tf.float32),
            tf.constant(settings.top_k), tf.constant(settings.top_p, tf.float32),
            tf.constant(settings.repetition_penalty, tf.float32), tf.constant(settings.length_penalty, tf.float32),
            tf.constant(settings.agreement, tf.float32), tf.constant(settings.mbr, tf.float32), tf.constant(seed))

    def check(self, tone=None, **decoding) -> None:
        """Raise ValueError for a tone or a decoding option this model refuses, before any decoding
        (the CLI and the app call it once a model is picked)."""
        self.tone_ids(tone, 0)
        self.settings(**decoding)  # no tensors: the app checks every request twice before it joins a batch

    def warm_up(self, rows=BATCH_BUCKETS[:5], **decoding) -> None:
        """Trace and compile everything a reply with these settings needs, for batches of `rows` (the web
        app does it at start, in the background, up to its `ReplyBatcher`'s largest batch, 16), so the first
        requests of each size do not wait for XLA."""
        settings, options = self.options(**decoding)
        self.decoder.warm_up(settings, options, rows)

    def reply_ids(self, texts: list[str], tone=None, **decoding) -> np.ndarray:
        texts = check_questions(texts)
        tones = self.tone_ids(tone, len(texts))
        settings, options = self.options(**decoding)
        return self.decoder.generate(list(texts), options, settings, tones)[0].numpy()

    def reply_batch(self, texts: list[str], tone=None, **decoding) -> list[str]:
        """Replies to many questions at once; `tone`: None, or everyday/sad/love (or 0-2) for all of them."""
        texts = check_questions(texts)
        tones = self.tone_ids(tone, len(texts))
        settings, options = self.options(**decoding)
        if not texts:
            return []
        return self.texts_of(*self.decoder.generate(texts, options, settings, tones))

    def texts_of(self, ids, replies=None) -> list[str]:
        """Reply ids (batch, max_length) as the strings users get: a reply that ran to its limit in a loop is
        cut (`runaway_cut`). `replies`: the graph's detokenized strings of `ids`, when at hand."""
        replies = self.tokenizer.detokenize(ids) if replies is None else replies
        replies = [reply.decode("utf-8") for reply in replies.numpy()]
        for row, reply_ids in enumerate(np.asarray(ids).tolist()):
            cut = runaway_cut(reply_ids)
            if cut is not None:
                replies[row] = self.tokenizer.decode([reply_ids[:cut]])[0]
        return replies

    def reply(self, text: str, tone=None, details: bool = False, **decoding):
        """The reply as a string; with `details`, a dict that also says where it came from (`provenance`)."""
        reply = self.reply_batch([text], tone, **decoding)[0]
        return self.provenance(text, reply) if details else reply

    def provenance(self, text: str, reply: str) -> dict:
        """`reply`; `copied`: whether it is exactly a training answer; `source_question`: then the training
        question with that answer nearest to `text`; `nearest_question`: the training question nearest to
        `text` (what retrieval would answer with its answer). A learner sees what the model wrote itself."""
        result = {"reply": reply, "copied": False, "source_question": None, "nearest_question": None}
        if self.retriever is None:
            return result
        if self._answer_rows is None:
            self._answer_rows = {}
            for row, pair in enumerate(self.retriever.pairs):
                self._answer_rows.setdefault(pair.answer, []).append(row)
        similarity = self.retriever.similarity(tf.constant([text]))[0].numpy()
        result["nearest_question"] = self.retriever.pairs[int(similarity.argmax())].question
        rows = self._answer_rows.get(reply)
        if rows:
            best = max(rows, key=lambda row: similarity[row])
            result.update(copied=True, source_question=self.retriever.pairs[best].question)
        return result

    def stream(self, text: str, tone=None, **decoding) -> Iterator[str]:
        """Yield the growing reply, one token at a time (each step is one compiled call)."""
        text = check_questions([text])[0]
        tones = tf.constant(self.tone_ids(tone, 1), tf.int32)
        settings, options = self.options(**decoding)
        if settings.strategy == "beam" or self.decoder.candidate_count(settings.candidates):
            # beams are ranked, and the reply weighed against retrieved answers, only at the end: decode, then reveal
            pieces = [self.tokenizer.piece_text(i) for i in _trim(self.reply_ids([text], tone, **decoding))[0]]
            for end in range(1, len(pieces) + 1):
                yield self.tokenizer.join_pieces(pieces[:end])
            return
        step, start, encode = self._streaming(settings)
        state = start(encode(tf.constant([text]), tones))
        pieces, previous, ids = [], "", []
        for _ in range(int(options.steps)):
            state = step(state, options)
            if bool(state.finished[0]):
                break
            ids.append(int(state.tokens[0, int(state.index)]))
            cut = runaway_cut(ids) if len(ids) == self.decoder.max_length else None
            if cut is not None:
                yield self.tokenizer.decode([ids[:cut]])[0]  # what reply() gives
                return
            pieces.append(self.tokenizer.piece_text(ids[-1]))
            current = self.tokenizer.join_pieces(pieces)  # only the new piece is looked up, never the prefix
            if current != previous:
                previous = current
                yield current
        if not previous:
            yield ""

    def _streaming(self, settings: GenerationConfig):
        """Graph functions for streaming: one decoder step, the start state and the encoder input, each
        traced once. Not XLA: a compilation costs seconds per encoder length on a CPU, which the first
        streamed reply would wait for, while a step is a few milliseconds either way."""
        key = (settings.strategy, settings.no_repeat_ngram_size)
        sampler = sampler_for(settings)
        step = self._step.get(key, lambda: tf.function(
            lambda s, o: self.decoder.step(s, o, sampler, settings.no_repeat_ngram_size), autograph=False))
        return step, self._start, self._encode

    def attention(self, text: str, reply: str | None = None, tone=None) -> dict:
        """Cross-attention of a reply over the encoder input (the question, and the retrieved answers if
        the model reads them): tokens and weights (layers, heads, reply, encoder input)."""
        check_questions([text])
        encoder_ids = self.decoder.encoder_ids(tf.constant([text]), tf.constant(self.tone_ids(tone, 1))).to_tensor()
        reply_ids = _trim(self.reply_ids([text], tone))[0] if reply is None else self.tokenizer.encode([reply])[0]
        reply_ids = list(reply_ids)[:self.decoder.max_length - 1]  # the start token and the reply share the positions
        decoder_ids = tf.constant([[START_ID, *reply_ids]], tf.int32)
        memory = self.model.encode(encoder_ids, training=False)
        _, attention = self.model.decode(decoder_ids, memory, encoder_ids, return_attention=True)
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
        for _ in range(self.decoder.step_limit(max_new_tokens)):
            logits = self.model((encoder_ids, tf.constant([output], tf.int32)), training=False)[:, -1]
            token = int(tf.argmax(suppress_special(logits, len(output) - 1), axis=-1)[0])
            if token == END_ID:
                break
            output.append(token)
        reply = output[1:]
        cut = runaway_cut(reply) if len(reply) == self.decoder.max_length else None  # trimmed as `reply` is
        return self.tokenizer.decode([reply[:cut]])[0]


def runaway_cut(ids: list[int], copies: int = 3) -> int | None:
    """Where to cut a reply that ran to its length limit without an end token while repeating itself
    ("있어요 있어요 있어요 ..."): after the first of the `copies` or more repeats of a block of 1-8 tokens at its
    end. None for a reply that ended (or is padded) or does not end in such a loop."""
    if not ids or END_ID in ids or PAD_ID in ids:
        return None
    for period in range(1, 9):
        repeats = 1
        while (repeats + 1) * period <= len(ids) and \
                ids[len(ids) - (repeats + 1) * period:len(ids) - repeats * period] == ids[len(ids) - period:]:
            repeats += 1
        if repeats >= copies:
            return len(ids) - (repeats - 1) * period
    return None


def _trim(ids) -> list[list[int]]:
    """Cut each row of reply ids at its end token."""
    rows = []
    for row in np.asarray(ids).tolist():
        rows.append(row[:row.index(END_ID)] if END_ID in row else [t for t in row if t != PAD_ID])
    return rows

"""`Chatbot`: answering questions with a trained model, fast.

Owns: the Python API over the decoding room (`chatbot.decoding.CachedDecoder`: the encoder runs once per
request, each step feeds one token and reuses the key/value cache, the whole reply is one XLA-compiled loop):
checking questions, tones and options once, at the edge, into a `GenerationConfig`, its `Plan` and `Options`;
replies and batches, streaming, warm-up, attention maps, and the naive full-recompute greedy decoder kept as
the test oracle. Must not touch Gradio.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from chatbot.artifacts import load_model_dir
from chatbot.config import TONES, ChatbotConfig, GenerationConfig
from chatbot.decoding import BATCH_BUCKETS, CachedDecoder
from chatbot.plan import Options, Plan
from chatbot.replies import Provenance, revealed, runaway_cut, streamed_text, trim
from chatbot.safety import crisis_reply
from chatbot.samplers import suppress_special
from chatbot.text import check_history, check_questions, question_part, with_context
from chatbot.tokenizer import END_ID, START_ID, Tokenizer

__all__ = ["Chatbot", "runaway_cut"]


class Chatbot:
    """A trained model ready to answer. Decoding options: see `GenerationConfig`; every method that decodes
    takes them as keywords, or already checked as `settings`. With `jit_compile=False` the same decoding loop
    runs as a plain graph: no XLA compilation per batch and encoder-length shape (seconds each on a CPU) but
    slower replies; for tests and scripts. With "eager" it runs op by op, untraced: for a process that
    answers one question."""

    def __init__(self, model, tokenizer: Tokenizer, config: ChatbotConfig, path: str | Path | None = None,
                 retriever=None, jit_compile: bool | str = True):
        self.model, self.tokenizer, self.config, self.path = model, tokenizer, config, path
        self.retriever = retriever
        self.decoder = CachedDecoder(model, tokenizer, config.context, retriever, jit_compile, config.rerank)
        self._provenance = Provenance(retriever)
        # whether a streamed question gets the fallback: one traced graph, not the encoder op by op each time
        self._confident = None if retriever is None else tf.function(
            retriever.confident, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        self._seeds = random.Random()  # its own: code that reseeds Python's `random` (training) leaves it alone

    @classmethod
    def load(cls, path: str | Path, jit_compile: bool | str = True) -> "Chatbot":
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

    def settings(self, settings: GenerationConfig | None = None, **decoding) -> GenerationConfig:
        """Checked settings: `settings` as given, or made from `decoding`. Raises ValueError for an option out
        of bounds or past this model's max_length."""
        if settings is None:
            settings = GenerationConfig(**decoding)
        elif decoding:
            raise TypeError(f"give settings or decoding options, not both (got {', '.join(decoding)})")
        if settings.no_repeat_ngram_size > self.decoder.max_length:
            raise ValueError(f"no_repeat_ngram_size must be 0 or 2..{self.decoder.max_length} (this model's "
                             f"max_length), got {settings.no_repeat_ngram_size}")
        return settings

    def options(self, settings: GenerationConfig | None = None, **decoding) -> tuple[GenerationConfig, Options]:
        """Checked settings and their tensors. Raises ValueError for an option out of bounds, always
        before any compiled call, so a bad request never leaves decoding half-done."""
        settings = self.settings(settings, **decoding)
        seed = settings.seed if settings.seed is not None else self._seeds.randrange(2**31 - 1)
        return settings, Options.of(settings, self.decoder.max_length, seed)

    def check(self, tone=None, settings: GenerationConfig | None = None, **decoding) -> GenerationConfig:
        """The checked settings; ValueError for a tone or a decoding option this model refuses, before any
        decoding (the CLI and the app call it once a model is picked)."""
        self.tone_ids(tone, 0)
        return self.settings(settings, **decoding)  # no tensors

    def warm_up(self, rows=BATCH_BUCKETS[:5], settings: GenerationConfig | None = None, **decoding) -> None:
        """Trace and compile everything a reply with these settings needs, for batches of `rows` (the web
        app does it at start, in the background, up to its `ReplyBatcher`'s largest batch, 16), so the first
        requests of each size do not wait for XLA."""
        settings, options = self.options(settings, **decoding)
        jit = self.decoder.jit_compile in (True, "warmed")
        self.decoder.warm_up(options, self.decoder.plan(settings, jit=jit), rows)

    def ready(self, settings: GenerationConfig) -> bool:
        """Whether a reply with these checked settings runs at once, with no graph to trace first."""
        return self.decoder.ready(self.decoder.plan(settings))

    @property
    def reads_context(self) -> bool:
        """Whether the model learned to read the conversation before a message (its training data had dialogues)."""
        return self.config.context.turns > 0

    def in_context(self, text: str, history=None) -> str:
        """A checked question with the conversation before it (`history`: `{"role": "user" | "assistant",
        "content": str}` messages, oldest first) as the one string the model reads (`chatbot.text.with_context`):
        the question and its last `ContextConfig.turns` messages (none for a model that reads no context).
        Raises ValueError for a bad question or history."""
        (text,) = check_questions([text])
        return with_context(text, check_history(history), self.config.context.turns)

    def _checked(self, texts, tone, settings, decoding, histories=None) -> tuple[list[str], list[int],
                                                                                  GenerationConfig, Options]:
        """The questions (with their conversations, if `histories` gives one per question), their tones, the
        settings and their tensors, all checked before any decoding."""
        texts = check_questions(texts)
        if histories is not None:
            if isinstance(histories, (str, dict)) or len(histories) != len(texts):
                raise ValueError("histories must be a list with one history per question")
            texts = [self.in_context(text, history) for text, history in zip(texts, histories)]
        return texts, self.tone_ids(tone, len(texts)), *self.options(settings, **decoding)

    def reply_ids(self, texts: list[str], tone=None, settings: GenerationConfig | None = None,
                  **decoding) -> np.ndarray:
        texts, tones, settings, options = self._checked(texts, tone, settings, decoding)
        return self.decoder.replies(texts, tones, options, self.decoder.plan(settings))[0].numpy()

    def reply_batch(self, texts: list[str], tone=None, settings: GenerationConfig | None = None,
                    histories=None, **decoding) -> list[str]:
        """Replies to many questions at once; `tone`: None, or everyday/sad/love (or 0-2) for all of them;
        `histories`: None, or each question's conversation before it (see `in_context`)."""
        texts, tones, settings, options = self._checked(texts, tone, settings, decoding, histories)
        if not texts:
            return []
        replies = self.texts_of(*self.decoder.replies(texts, tones, options, self.decoder.plan(settings)))
        return self.with_crisis_replies(texts, replies)

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

    @staticmethod
    def with_crisis_replies(texts: list[str], replies: list[str]) -> list[str]:
        """Each reply, or the fixed crisis reply where its question may signal self-harm, suicide or abuse
        (`chatbot.safety`): no decoding setting or training row changes what such a message gets."""
        return [crisis_reply(question_part(text)) or reply for text, reply in zip(texts, replies)]

    def reply(self, text: str, tone=None, details: bool = False, settings: GenerationConfig | None = None,
              history=None, **decoding):
        """The reply as a string; with `details`, a dict that also says where it came from (`provenance`).
        `history`: the conversation before `text`, as `{"role": "user" | "assistant", "content": str}` messages,
        oldest first (Gradio's chat format); a model trained on dialogues reads its last messages."""
        reply = self.reply_batch([text], tone, settings, None if history is None else [history], **decoding)[0]
        return self.provenance(text, reply, history) if details else reply

    def provenance(self, text: str, reply: str, history=None) -> dict:
        """Whether `reply` is exactly a training answer and which question it answered (`replies.Provenance`),
        for `text` with the conversation before it (`history`, as for `reply`)."""
        return self._provenance(self.in_context(text, history), reply)

    def stream(self, text: str, tone=None, settings: GenerationConfig | None = None, history=None,
               **decoding) -> Iterator[str]:
        """Yield the growing reply, one token at a time (each step is one graph call); `history` as for `reply`."""
        (text,), tones, settings, options = self._checked([text], tone, settings, decoding,
                                                           None if history is None else [history])
        crisis = crisis_reply(question_part(text))
        if crisis:  # at once and whole: nothing the model would write first
            yield crisis
            return
        if self.retriever is not None and not bool(self._confident(tf.constant([text]))[0]):
            yield self.retriever.config.fallback  # nothing in training is close enough: say so, whole
            return
        plan = self.decoder.plan(settings, jit=False)  # streamed steps are plain graphs (see `PlanGraphs`)
        if plan.strategy == "beam" or plan.candidates:
            # beams are ranked, and the reply weighed against retrieved answers, only at the end: decode, then reveal
            ids = self.decoder.replies([text], tones, options, self.decoder.plan(settings))[0]
            yield from revealed(self.tokenizer, trim(ids.numpy())[0])
            return
        tokens = self.decoder.graphs_for(plan).tokens(text, tones[0], options)
        yield from streamed_text(self.tokenizer, tokens, self.decoder.max_length)

    def attention(self, text: str, reply: str | None = None, tone=None) -> dict:
        """Cross-attention of a reply over the encoder input (the question, and the retrieved answers if
        the model reads them): tokens and weights (layers, heads, reply, encoder input)."""
        check_questions([text])
        encoder_ids = self.decoder.encoder_ids(tf.constant([text]), tf.constant(self.tone_ids(tone, 1))).to_tensor()
        reply_ids = trim(self.reply_ids([text], tone))[0] if reply is None else self.tokenizer.encode([reply])[0]
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
        encoder_ids = self.decoder.prepare(tf.constant([text]), None, Plan()).encoder_ids
        output = [START_ID]
        for _ in range(min(max_new_tokens, self.decoder.max_length)):
            logits = self.model((encoder_ids, tf.constant([output], tf.int32)), training=False)[:, -1]
            token = int(tf.argmax(suppress_special(logits, len(output) - 1), axis=-1)[0])
            if token == END_ID:
                break
            output.append(token)
        reply = output[1:]
        cut = runaway_cut(reply) if len(reply) == self.decoder.max_length else None  # trimmed as `reply` is
        return self.tokenizer.decode([reply[:cut]])[0]

"""`Chatbot`: the front door. A model directory loaded, and the calls a person or a program makes of it.

    reply / reply_batch / stream  ->  `request` (the one validation: texts, history, tones, settings, Plan)
        ->  `Generator.generate`: one compiled function per plan, from the texts and tones to the final strings
            (`chatbot.decoding.generate`: prepare, the loop, then tidy, the fallback and the crisis reply)

Owns: loading (`load`), the one validation of a request (`request`, `check`, `tone_ids`, `in_context`), the public
calls (`reply`, `reply_batch`, `stream`, `provenance`, `attention`, `naive_reply`), the seeds of sampling, and the
warm-up threads of the CLI and the app. Must not touch Gradio, parse flags or import training code.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import tensorflow as tf

from chatbot.artifacts import load_model_dir
from chatbot.config import TONES, ChatbotConfig, Compilation, GenerationConfig, SettingsError
from chatbot.data.text import check_history, check_questions, one_message
from chatbot.data.text_tf import with_context_tf
from chatbot.decoding.generate import BATCH_BUCKETS, Generator
from chatbot.decoding.inspect import Provenance, attention
from chatbot.decoding.loop import Loop
from chatbot.decoding.postprocess import Finisher, trim
from chatbot.decoding.prepare import Preparer
from chatbot.decoding.request import Options, Plan, Request
from chatbot.tokenizer.subword import PAD_ID, Tokenizer

__all__ = ["Chatbot", "Compilation", "Options", "Plan", "Request"]


class Chatbot:
    """A trained model ready to answer. Decoding options: see `GenerationConfig`; every method that decodes takes
    them as keywords, or already checked as `settings`. `compilation`: see `Compilation` (strings name its members).
    `crisis_by_meaning`: with e5 loaded, also run `chatbot.safety.meaning`'s classifier beside the list; off by
    default, as it also takes greetings and goodbyes ("안녕", "안녕히 계세요") for a crisis (BENCHMARKS.md)."""

    def __init__(self, model, tokenizer: Tokenizer, config: ChatbotConfig, path: str | Path | None = None,
                 retriever=None, compilation: Compilation | str = Compilation.XLA, crisis_by_meaning: bool = False):
        self.model, self.tokenizer, self.config, self.path = model, tokenizer, config, path
        self.context, self.retriever, self.rerank_weights = config.context, retriever, config.rerank
        self.max_length = model.max_length
        if self.context.retrieved and retriever is None:
            raise ValueError("this model reads retrieved answers: it needs its retrieval index")
        self.compilation = Compilation(compilation)
        # which pieces begin a word, for `tidy` (a model driven by ids alone, without a tokenizer: none)
        self.word_starts = (tf.constant(tokenizer.word_starts()) if tokenizer is not None
                            else tf.zeros([model.vocab_size], tf.bool))
        self.crisis_head, crisis_classes = None, None
        if retriever is not None and retriever.config.pretrained:  # the message's e5 pass: XLA where loops are
            retriever.pretrained.jit = self.compilation in (Compilation.XLA, Compilation.WARMED)
            if crisis_by_meaning:  # a crisis is also recognised by meaning (`chatbot.safety.meaning`)
                from chatbot.safety.meaning import load_head

                self.crisis_head = load_head()
                crisis_classes = lambda messages: self.crisis_head.classes(  # noqa: E731
                    retriever.pretrained.message_vectors(messages))
        self.prepare = Preparer(tokenizer, config, retriever, self.max_length, model.encoder_length)
        self.finish = Finisher(tokenizer, retriever, self.word_starts, crisis_classes)
        self.generator = Generator(self.prepare, Loop(model, config.rerank), self.finish, self.compilation,
                                   first_plan=self.plan(GenerationConfig(), jit=False))
        self._provenance = Provenance(retriever)
        self._seeds = random.Random()  # its own: code that reseeds Python's `random` (training) leaves it alone
        # the stream's checks, each one traced graph: the crisis reply of a message, whether any training question
        # is close enough, and a growing prefix's text as `tidy` leaves it
        self._crisis_of = tf.function(lambda texts: self.finish.crisis(texts, tf.fill(tf.shape(texts), "")),
                                      input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        self._confident = None if retriever is None else tf.function(
            retriever.confident, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        self._prefix_text = tf.function(self.finish.prefix_text, autograph=False,
                                        input_signature=[tf.TensorSpec([None, self.max_length], tf.int32)])
        self._with_context = tf.function(lambda texts, history: with_context_tf(texts, history, self.context.turns),
                                         input_signature=[tf.TensorSpec([None], tf.string),
                                                          tf.TensorSpec([None, None], tf.string)], autograph=False)

    @classmethod
    def load(cls, path: str | Path, compilation: Compilation | str = Compilation.XLA,
             crisis_by_meaning: bool = False) -> "Chatbot":
        config, tokenizer, model, retriever = load_model_dir(path)
        return cls(model, tokenizer, config, path, retriever, compilation, crisis_by_meaning)

    @property
    def has_tone(self) -> bool:
        """Whether the model learned tone tokens (its training data had a label column)."""
        return self.context.tone

    @property
    def reads_context(self) -> bool:
        """Whether the model learned to read the conversation before a message (its training data had dialogues)."""
        return self.context.turns > 0

    @property
    def length_buckets(self) -> tuple[int, ...]:
        """The encoder lengths a batch is padded to (each one XLA compilation per batch bucket)."""
        return self.prepare.length_buckets

    @property
    def compiled_plans(self) -> list[Plan]:
        """The plans whose compiled functions are kept, least recently used first."""
        return self.generator.compiled_plans

    # -- validate: once per request, before any decoding --

    def request(self, texts, tone=None, settings: GenerationConfig | None = None, histories=None,
                **decoding) -> Request:
        """The one check of a request: the questions (with their conversations, if `histories` gives one per
        question), the tone and the settings against this model. Raises `SettingsError` for a tone or an option
        this model refuses and ValueError for a bad question or history, always before any decoding."""
        texts = check_questions(texts)
        if histories is not None:
            if isinstance(histories, (str, dict)) or len(histories) != len(texts):
                raise ValueError("histories must be a list with one history per question")
            texts = self.with_contexts(texts, [check_history(history) for history in histories])
        tones = self.tone_ids(tone, len(texts))
        if settings is None:
            try:
                settings = GenerationConfig(**decoding)
            except ValueError as error:
                raise SettingsError(str(error)) from None
        elif decoding:
            raise TypeError(f"give settings or decoding options, not both (got {', '.join(decoding)})")
        if settings.no_repeat_ngram_size > self.max_length:
            raise SettingsError(f"no_repeat_ngram_size must be 0 or 2..{self.max_length} (this model's "
                                f"max_length), got {settings.no_repeat_ngram_size}")
        return Request(texts, tones, settings, self.plan(settings))

    def check(self, tone=None, settings: GenerationConfig | None = None, **decoding) -> GenerationConfig:
        """The checked settings for this model and `tone`, with no question yet (the CLI checks its flags so)."""
        return self.request([], tone, settings, **decoding).settings

    def tone_ids(self, tone, count: int) -> list[int]:
        """A tone (None, 0/1/2 or everyday/sad/love) as the int the graph takes, once per question. A model that
        learned no tones ignores it."""
        if tone is None or tone == "":
            return [-1] * count
        if isinstance(tone, str) and tone in TONES:
            tone = TONES.index(tone)
        if isinstance(tone, bool) or not isinstance(tone, int) or tone not in range(len(TONES)):
            raise SettingsError(f"tone must be one of {', '.join(TONES)} (or 0-2), got {tone!r}")
        return [tone if self.has_tone else -1] * count

    def in_context(self, text: str, history=None) -> str:
        """A checked question with the conversation before it (`history`: `{"role": "user" | "assistant",
        "content": str}` messages, oldest first) as the one string the model reads (`with_contexts`).
        Raises ValueError for a bad question or history."""
        (text,) = check_questions([text])
        return self.with_contexts([text], [check_history(history)])[0]

    def with_contexts(self, texts: list[str], histories: list[list[str]]) -> list[str]:
        """Checked questions and the checked texts of the messages before each (oldest first) as the strings the
        model reads (`chatbot.data.text_tf.with_context_tf`, one traced call for all that have a history; a question
        with none is itself, one message)."""
        texts = [one_message(text) for text in texts]
        rows = [row for row, history in enumerate(histories) if history] if self.context.turns else []
        if rows:
            width = max(len(histories[row]) for row in rows)
            history = tf.constant([histories[row] + [""] * (width - len(histories[row])) for row in rows], tf.string)
            joined = self._with_context(tf.constant([texts[row] for row in rows]), history).numpy()
            for row, text in zip(rows, joined):
                texts[row] = text.decode("utf-8")
        return texts

    def plan(self, settings: GenerationConfig, jit: bool | None = None) -> Plan:
        """The static options of checked `settings`; `jit` None: as `compilation` says."""
        retrievable = 0 if self.retriever is None else len(self.retriever)
        if jit is None and self.compilation is Compilation.WARMED:
            compiled = Plan.of(settings, retrievable, jit=True)
            return compiled if compiled in self.generator.warmed else Plan.of(settings, retrievable, jit=False)
        return Plan.of(settings, retrievable, self.compilation is Compilation.XLA if jit is None else jit)

    def options(self, settings: GenerationConfig) -> Options:
        """The tensors of checked `settings`, with a fresh seed when they name none."""
        seed = settings.seed if settings.seed is not None else self._seeds.randrange(2**31 - 1)
        return Options.of(settings, self.max_length, seed)

    # -- the public calls --

    def reply(self, text: str, tone=None, details: bool = False, settings: GenerationConfig | None = None,
              history=None, **decoding):
        """The reply as a string; with `details`, a dict that also says where it came from (`provenance`).
        `history`: the conversation before `text`, as `{"role": "user" | "assistant", "content": str}` messages,
        oldest first (Gradio's chat format); a model trained on dialogues reads its last messages. `text` is one
        message (`chatbot.data.text.one_message`), with or without a history."""
        request = self.request([text], tone, settings, [history], **decoding)
        reply = self.answer(request)[0]
        return self._provenance(request.texts[0], reply) if details else reply

    def reply_batch(self, texts: list[str], tone=None, settings: GenerationConfig | None = None,
                    histories=None, **decoding) -> list[str]:
        """Replies to many questions at once; `tone`: None, or everyday/sad/love (or 0-2) for all of them;
        `histories`: each question's conversation before it (see `in_context`; each question is then one message),
        or None: each text as the model reads it, which may already hold its conversation joined by
        `chatbot.data.text.TURN` (as `data.load_pairs` writes a dialogue file's questions, for evaluation)."""
        return self.answer(self.request(texts, tone, settings, histories, **decoding))

    def answer(self, request: Request) -> list[str]:
        """The replies to a checked request: its plan's compiled function, whose strings are what users read."""
        if not request.texts:
            return []
        strings = self.generator.generate(request.texts, request.tones, self.options(request.settings),
                                          request.plan)[1]
        return [reply.decode("utf-8") for reply in strings.numpy()]

    def reply_ids(self, texts: list[str], tone=None, settings: GenerationConfig | None = None,
                  **decoding) -> np.ndarray:
        """The reply ids (batch, max_length) of the reply graph: tidied (`tidy`), the fallback's rows empty."""
        request = self.request(texts, tone, settings, **decoding)
        return self.generator.generate(request.texts, request.tones, self.options(request.settings),
                                       request.plan)[0].numpy()

    def encoder_ids(self, texts, tones=None) -> tf.RaggedTensor:
        """What the encoder reads for each text (batch, None), composed as training composes it (`Preparer`)."""
        return self.prepare.encoder_ids(texts, tones)

    def stream(self, text: str, tone=None, settings: GenerationConfig | None = None, history=None,
               **decoding) -> Iterator[str]:
        """Yield the growing reply, one token at a time (each step is one graph call); `history` as for `reply`.
        A crisis reply and the fallback come at once and whole; with beams or `candidates`, whose reply is chosen
        at the end, it decodes first and then reveals the reply. What it shows last is what `reply` gives."""
        request = self.request([text], tone, settings, [history], **decoding)
        texts = tf.constant(request.texts)
        crisis = self._crisis_of(texts)[0].numpy().decode("utf-8")
        if crisis:  # at once and whole: nothing the model would write first
            yield crisis
            return
        if self._confident is not None and not bool(self._confident(texts)[0]):
            yield self.retriever.config.fallback  # nothing in training is close enough: say so, whole
            return
        options = self.options(request.settings)
        if request.plan.strategy == "beam" or request.plan.candidates:
            ids = self.generator.generate(request.texts, request.tones, options, request.plan)[0]  # tidied
            tokens = iter(trim(ids.numpy())[0])
        else:
            tokens = self._tokens(texts, request.tones, options, request.plan)
        yield from self._shown(tokens)

    def _tokens(self, texts, tones, options: Options, plan: Plan) -> Iterator[int]:
        """One question's reply token by token, as each step chooses it, until it ends or `options.steps`."""
        begin, step = self.generator.stream_functions(plan)
        state = begin(texts, tf.constant(tones, tf.int32))
        for _ in range(int(options.steps)):
            state = step(state, options)
            if bool(state.finished[0]):
                return
            yield int(state.tokens[0, int(state.index)])

    def _shown(self, tokens: Iterator[int]) -> Iterator[str]:
        """The growing reply as its tokens arrive, each time its text changes ("" for an empty reply): each prefix as
        `Finisher.prefix_text` shows it (tidied as the whole reply is, so the text may shrink). Where `tidy` cuts the prefix, the stream ends with the cut text."""
        previous, ids = None, []
        for token in tokens:
            ids.append(token)
            text, cut = self._prefix_text(np.array([ids + [PAD_ID] * (self.max_length - len(ids))], np.int32))
            current = text[0].numpy().decode("utf-8")
            if current != previous:
                previous = current
                yield current
            if bool(cut[0]):
                return
        if previous is None:
            yield ""

    def provenance(self, text: str, reply: str, history=None) -> dict:
        """Whether `reply` is exactly a training answer and which question it answered (`Provenance`), for `text`
        with the conversation before it (`history`, as for `reply`)."""
        return self._provenance(self.in_context(text, history), reply)

    def attention(self, text: str, reply: str | None = None, tone=None) -> dict:
        """Cross-attention of a reply (this model's own, or `reply`) over the encoder input (the question, and the
        retrieved answers if the model reads them): tokens and weights (layers, heads, reply, encoder input)."""
        request = self.request([text], tone)
        encoder_ids = self.encoder_ids(tf.constant(request.texts), tf.constant(request.tones)).to_tensor()
        if reply is None:
            reply_ids = trim(self.generator.generate(request.texts, request.tones, self.options(request.settings),
                                                     request.plan)[0].numpy())[0]
        else:
            reply_ids = self.tokenizer.encode([reply])[0]
        return attention(self.model, self.tokenizer, encoder_ids, reply_ids)

    def naive_reply(self, text: str, tone=None, settings: GenerationConfig | None = None, **decoding) -> str:
        """The reply decoded the seed tutorial's way (`Loop.naive`: the whole model re-run on the whole prefix for
        every new token, eagerly, one question at a time), then finished as every reply is: the oracle the cached,
        compiled engine is tested against. Any strategy; `candidates` is left out."""
        request = self.request([text], tone, settings, **decoding)
        options, plan = self.options(request.settings), Plan.of(request.settings, 0, jit=False)
        prepared = self.prepare(tf.constant(request.texts), tf.constant(request.tones), 0)
        ids = self.generator.loop.naive(prepared, options, plan)
        return self.finish(tf.constant(request.texts), ids, prepared.confident)[1][0].numpy().decode("utf-8")

    # -- compile latency: every warm-up and background trace --

    def ready(self, plan: Plan) -> bool:
        """Whether a reply with `plan` runs at once, with no graph to trace first (`Generator.ready`)."""
        return self.generator.ready(plan)

    def warm_up(self, rows=BATCH_BUCKETS[:5], settings: GenerationConfig | None = None, **decoding) -> None:
        """Compile everything a reply with these settings needs, for batches of `rows` and every encoder length
        (the web app does it at start, in the background, up to its `ReplyBatcher`'s largest batch, 16). Under
        `Compilation.WARMED`, requests with this plan use XLA only from then on: none waits for it."""
        request = self.request([], None, settings, **decoding)
        plan = self.plan(request.settings, jit=self.compilation in (Compilation.XLA, Compilation.WARMED))
        self.generator.warm_up(self.options(request.settings), plan, rows)

    def trace_first_replies(self, question: str = "안녕", streamed: bool = True) -> None:
        """Answer one question with the default settings as `/chat` does (and, with `streamed`, as the chat streams
        it), so that the graphs a first request runs are traced before anyone asks: a trace costs seconds on a CPU
        (the first in a process most), a reply then tens of milliseconds."""
        reply = self.reply(question)
        if streamed:
            for _ in self.stream(question):
                pass
            self.provenance(question, reply)  # builds its table of training answers once

    def warm_up_in_background(self, log=lambda line: print(line, flush=True)) -> threading.Thread:
        """In a daemon thread, trace the first streamed reply (`trace_first_replies`: the app serves its page
        first, while a browser user is still typing), then compile the default decoding with XLA for every batch
        and encoder-length bucket, so a burst of requests finds the compiled loops ready; `log` gets one line
        when it is done."""
        def warm_up():
            self.trace_first_replies()
            started = time.perf_counter()
            self.warm_up()
            log(f"warm-up done: every batch shape compiled in {time.perf_counter() - started:.0f} s")

        thread = threading.Thread(target=warm_up, name="warm-up", daemon=True)
        thread.start()
        return thread

    def trace_in_background(self, **decoding) -> threading.Thread:
        """Trace the reply graph of `decoding` in a daemon thread (while a terminal user types the first question).
        A question asked sooner waits for the same trace (a graph function traces once for all its callers); an
        error is left to the user's own first reply, which meets and says it."""
        def trace():
            try:
                self.reply("안녕", **decoding)
            except Exception:  # noqa: BLE001
                pass

        thread = threading.Thread(target=trace, name="trace", daemon=True)
        thread.start()
        return thread

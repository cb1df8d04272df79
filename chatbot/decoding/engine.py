"""The reply engine: a trained model answering questions, in one direction, the way keras-hub's `generate` runs.

    reply / reply_batch / stream  ->  request (validate once: texts, tones, settings, Plan)
        ->  prepare (strings -> encoder ids and retrieved answers, a plain graph: XLA compiles no string ops)
        ->  the plan's compiled function (one per Plan, memoized: the encoder pass, the key/value-cached loop
            over `step` with the plan's sampler, beam ranking, the optional rerank; XLA when the plan says so)
        ->  `tidy` (a stutter said once, a phrase said twice in a row or a runaway loop cut: `repeat_cut`), the
            fallback and detokenizing, in the same graph
        ->  postprocess (the crisis reply: the list, then, if asked for, e5's classifier)

Owns: `Chatbot` (the Python API: `reply`, `reply_batch`, `stream`, `attention`, `provenance`, `in_context`,
`warm_up`), the one validation of a request (`Chatbot.request`), `Plan` and `Options` (the static options that key
a compiled function, and the options that are tensors, so changing them never recompiles), `Compilation` (eager,
graph, xla, or xla once warmed up) and every warm-up and background trace, the bounded cache of compiled
functions, `tidy` and `repeat_cut`, `Provenance`, and the naive full-recompute decoder (`naive_reply`,
every strategy) kept beside the cached one as its test oracle. Must not touch Gradio, parse flags or import
training code.
"""

from __future__ import annotations

import random
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Hashable, Iterator, NamedTuple

import numpy as np
import tensorflow as tf

from chatbot.artifacts import load_model_dir
from chatbot.config import TONES, ChatbotConfig, Compilation, GenerationConfig, SettingsError
from chatbot.model.inputs import bucket, compose_encoder_inputs
from chatbot.decoding.rerank import agreement, beam_consensus, choose, features
from chatbot.safety.keywords import crisis_reply
from chatbot.decoding.samplers import NEG_INF, process_logits, sampler_for
from chatbot.data.text import check_history, check_questions, conversation, normalize, question_part, with_context
from chatbot.tokenizer.subword import END_ID, PAD_ID, START_ID, Tokenizer

__all__ = ["Chatbot", "Compilation", "Plan", "Options", "Request", "repeat_cut", "tidy"]

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batches are padded to these many rows (XLA shapes)
COMPILED_KEPT = 8  # plans whose compiled functions are kept (the defaults and a few others)


# -- what one decoding call is made of ------------------------------------------------------------------------


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

    texts: list[str]  # each question with the conversation before it (`chatbot.data.text.with_context`)
    tones: list[int]  # one per question: 0-2, or -1 for none
    settings: GenerationConfig
    plan: Plan

    @staticmethod
    def joined(requests: list["Request"]) -> "Request":
        """Requests with equal settings and plans as one batch (the first one's settings and plan)."""
        head = requests[0]
        return head._replace(texts=[t for r in requests for t in r.texts], tones=[t for r in requests for t in r.tones])


class State(NamedTuple):
    """The decoding loop's state. Rows are replies: `num_beams` per question (one unless beam search)."""

    index: tf.Tensor  # position of the last written token
    tokens: tf.Tensor  # (rows, max_length + 1): start token, reply, padding
    finished: tf.Tensor  # (rows,) bool
    seen: tf.Tensor  # (rows, vocab) bool: tokens already in the reply
    scores: tf.Tensor  # (rows,) summed log-probability of each reply
    self_cache: tf.Tensor
    cross_cache: tf.Tensor
    encoder_ids: tf.Tensor  # (rows, src_len): what the decoder attends to and may copy from


class Prepared(NamedTuple):
    """What `prepare` hands the compiled loop, one row per question."""

    encoder_ids: tf.Tensor  # (batch, src_len), padded with 0 to a length bucket
    retrieved: tf.Tensor  # (batch, candidates, max_length): retrieved answers as reply ids, ended by END_ID
    scores: tf.Tensor  # (batch, candidates): their retrieval scores
    confident: tf.Tensor  # (batch,) float32: 1 where a training question is close enough (else the fallback)


class CompiledCache:
    """`get(key, build)`: the function stored under `key`, built by `build()` on a miss. At most `size` are kept,
    the least recently used dropped first: each holds traced graphs and XLA executables (tens of MB), and the
    plans that key them are valid user options, so an unbounded dictionary would let any caller grow memory."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        function = build()  # tracing happens on the first call, outside the lock
        with self._lock:
            function = self._items.setdefault(key, function)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return function

    def peek(self, key: Hashable, default=None):
        """The function stored under `key`, without building one or counting it as used."""
        return self._items.get(key, default)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __iter__(self):
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


# -- postprocess: what a user reads ---------------------------------------------------------------------------


REPEATED_PHRASE = 3  # tokens: a phrase at least this long said twice in a row is said once ("이유가 있지 않을까요." x2)
RUNAWAY_PERIOD = 8  # tokens: a shorter block repeated to the length limit ("있어요 있어요 있어요 ...") is cut too
STUTTER = 3  # copies: a block shorter than a phrase said this many times in a row is said once ("수고 수고 수고")


def tidy(ids: tf.Tensor, word_starts: tf.Tensor) -> tf.Tensor:
    """Reply ids (batch, max_length), padded after the end token, as a user reads them: a stutter said once
    (`stutter_kept`: "수고 수고 수고 많았어요!" -> "수고 많았어요!", the rest of the reply kept; `word_starts`: which
    pieces begin a word, (vocabulary,) bool, `Tokenizer.word_starts`), then the reply cut
    where `repeat_cut` cuts it; padding after what is kept. One graph function for every entry point: the reply
    graph runs it before the fallback (`Chatbot.with_fallback`: `reply`, `reply_batch`, the naive oracle, the
    SavedModel), and `stream` on each growing prefix, so what it shows grows into what `reply` gives."""
    ids, cut = tidy_parts(ids, word_starts)
    return tf.where(tf.range(ids.shape[1])[None] < cut[:, None], ids, PAD_ID)


def tidy_parts(ids: tf.Tensor, word_starts: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """`tidy` in two parts: the ids with each stutter said once (padding after), and where `repeat_cut` cuts them
    (batch,)."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    length = ids.shape[1]
    kept = stutter_kept(ids, word_starts)
    order = tf.argsort(tf.where(kept, 0, length) + tf.range(length)[None], axis=1, stable=True)  # kept first, in order
    ids = tf.where(tf.range(length)[None] < tf.reduce_sum(tf.cast(kept, tf.int32), axis=1, keepdims=True),
                   tf.gather(ids, order, batch_dims=1), PAD_ID)
    return ids, repeat_cut(ids)


def stutter_kept(ids: tf.Tensor, word_starts: tf.Tensor) -> tf.Tensor:
    """Which tokens of each reply (batch, max_length) to keep (bool): of a block of 1 to REPEATED_PHRASE - 1
    tokens holding the start of a word (`word_starts`, by piece id) said STUTTER or more times in a row, the first
    copy only. "네 네" (twice), "두근두근" and the pieces inside a word ("바나나나", "190000", "음...") stay; the end
    token and padding are kept."""
    length = ids.shape[1]
    valid = tf.range(length)[None] < _ended_at(ids)[:, None]
    starts = tf.gather(tf.convert_to_tensor(word_starts, tf.bool), ids)
    dropped = tf.zeros_like(valid)
    for period in range(1, REPEATED_PHRASE):
        word = starts
        for back in range(1, period):
            word |= tf.pad(starts[:, :-back], [[0, 0], [back, 0]])
        # token i repeats token i - period, and the block of `period` tokens that ends at i holds a word's start
        same = tf.pad(ids[:, period:] == ids[:, :-period], [[0, 0], [period, 0]]) & valid & word
        run = tf.cumsum(tf.cast(~same, tf.int32), axis=1)  # a run of repeats shares the number of the token before it
        runs = tf.reduce_sum(tf.cast((run[:, :, None] == tf.range(length + 1)[None, None]) & same[:, :, None],
                                     tf.int32), axis=1)  # (batch, run number): its repeated tokens
        dropped |= same & (tf.gather(runs, run, batch_dims=1) >= (STUTTER - 1) * period)
    return ~dropped


def repeat_cut(ids: tf.Tensor) -> tf.Tensor:
    """Where each reply stops being worth reading: reply ids (batch, max_length), padded after the end token, ->
    the number of tokens to keep (batch,) int32, max_length where nothing is cut. The earlier of two cuts: a
    phrase said twice in a row is said once (`phrase_cut`), and a loop run to the length limit is cut after its
    first copy (`runaway_cut`). `tidy` runs it after saying each stutter once."""
    ids = tf.convert_to_tensor(ids, tf.int32)
    return tf.minimum(phrase_cut(ids), runaway_cut(ids))


def _ended_at(ids: tf.Tensor) -> tf.Tensor:
    """The tokens before each row's end token or padding (batch,) int32 (max_length: none)."""
    ended = (ids == END_ID) | (ids == PAD_ID)
    return tf.where(tf.reduce_any(ended, axis=1), tf.argmax(tf.cast(ended, tf.int32), axis=1, output_type=tf.int32),
                    ids.shape[1])


def phrase_cut(ids: tf.Tensor) -> tf.Tensor:
    """A phrase of REPEATED_PHRASE or more tokens said twice in a row ("이유가 있지 않을까요. 이유가 있지 않을까요.")
    is said once: the reply ends after its first copy, at the first place such a pair ends (the shortest phrase,
    if several end there). Reply ids (batch, max_length) -> tokens kept (batch,), max_length where none is."""
    length = ids.shape[1]
    valid = _ended_at(ids)
    cut = tf.fill(tf.shape(ids)[:1], length)
    earliest = tf.fill(tf.shape(ids)[:1], length + 1)  # where the first pair found so far ends
    for period in range(REPEATED_PHRASE, length // 2 + 1):
        same = tf.cast(ids[:, :-period] == ids[:, period:], tf.int32)  # token i equals token i + period
        runs = tf.pad(tf.cumsum(same, axis=1), [[0, 0], [1, 0]])
        pair = runs[:, period:] - runs[:, :-period] == period  # tokens j..j+period-1 say again what follows them
        ends = tf.range(length - 2 * period + 1)[None] + 2 * period  # where the pair that starts at j ends
        found = pair[:, :length - 2 * period + 1] & (ends <= valid[:, None])
        first = tf.reduce_min(tf.where(found, ends, length + 1), axis=1)
        better = first < earliest
        cut = tf.where(better, first - period, cut)
        earliest = tf.where(better, first, earliest)
    return cut


def runaway_cut(ids: tf.Tensor, copies: int = 3) -> tf.Tensor:
    """A reply that ran to its length limit without an end token while repeating a block of 1-RUNAWAY_PERIOD
    tokens `copies` or more times ("있어요 있어요 있어요 ...") ends after the block's first copy. Reply ids
    (batch, max_length) -> tokens kept (batch,), max_length where none is."""
    length = ids.shape[1]
    ran_out = _ended_at(ids) == length
    cut = tf.fill(tf.shape(ids)[:1], length)
    found = tf.zeros_like(ran_out)
    for period in range(1, RUNAWAY_PERIOD + 1):  # the shortest looping block wins
        tail, repeats, going = ids[:, length - period:], tf.ones_like(cut), tf.ones_like(ran_out)
        for back in range(1, length // period):
            block = ids[:, length - (back + 1) * period:length - back * period]
            going &= tf.reduce_all(block == tail, axis=1)
            repeats += tf.cast(going, cut.dtype)
        loops = ran_out & ~found & (repeats >= copies)
        cut = tf.where(loops, length - (repeats - 1) * period, cut)
        found |= loops
    return cut


def trim(ids) -> list[list[int]]:
    """Cut each row of reply ids at its end token."""
    rows = []
    for row in np.asarray(ids).tolist():
        rows.append(row[:row.index(END_ID)] if END_ID in row else [t for t in row if t != PAD_ID])
    return rows


class Provenance:
    """`provenance(text, reply)` against one retrieval index; its table of training answers is built on first use."""

    def __init__(self, retriever):
        self.retriever = retriever
        self._answer_rows = None  # training answer -> its rows in the retrieval index

    def __call__(self, text: str, reply: str) -> dict:
        """`reply`; `copied`: whether it is exactly a training answer; `source_question`: then the training
        question with that answer nearest to `text`; `nearest_question`: the training question nearest to
        `text` (what retrieval would answer with its answer); `fallback`: whether the reply is the fallback, as no
        training question was close enough. A learner sees what the model wrote itself."""
        result = {"reply": reply, "copied": False, "source_question": None, "nearest_question": None,
                  "fallback": False}
        if self.retriever is None:
            return result
        if self._answer_rows is None:
            self._answer_rows = {}
            for row, pair in enumerate(self.retriever.pairs):
                self._answer_rows.setdefault(pair.answer, []).append(row)
        similarity = self.retriever.similarity(tf.constant([text]))[0].numpy()
        result["nearest_question"] = conversation(self.retriever.pairs[int(similarity.argmax())].question)
        config = self.retriever.config
        result["fallback"] = bool(reply == config.fallback and similarity.max() < config.threshold)
        rows = self._answer_rows.get(reply)
        if rows:
            best = max(rows, key=lambda row: similarity[row])
            result.update(copied=True, source_question=conversation(self.retriever.pairs[best].question))
        return result


# -- the engine ----------------------------------------------------------------------------------------------


class Chatbot:
    """A trained model ready to answer. Decoding options: see `GenerationConfig`; every method that decodes takes
    them as keywords, or already checked as `settings`. `compilation`: see `Compilation` (strings name its members).
    `crisis_by_meaning`: with e5 loaded, also run `chatbot.safety.meaning`'s classifier after the list; off by default, as it
    also takes greetings and goodbyes ("안녕", "안녕히 계세요") for a crisis (BENCHMARKS.md)."""

    def __init__(self, model, tokenizer: Tokenizer, config: ChatbotConfig, path: str | Path | None = None,
                 retriever=None, compilation: Compilation | str = Compilation.XLA, crisis_by_meaning: bool = False):
        self.model, self.tokenizer, self.config, self.path = model, tokenizer, config, path
        self.context, self.retriever, self.rerank_weights = config.context, retriever, config.rerank
        self.max_length = model.max_length
        if self.context.retrieved and retriever is None:
            raise ValueError("this model reads retrieved answers: it needs its retrieval index")
        self.compilation = Compilation(compilation)
        self.warmed: set[Plan] = set()  # plans whose loop `warm_up` compiled with XLA for every shape
        # Under WARMED, the one plain-graph plan traced: the defaults', which answers until warm-up has compiled them
        self._first_plan = self.plan(GenerationConfig(), jit=False)
        # A question alone fits in 16 tokens, most with a retrieved answer in 32, with two retrieved pairs and
        # their questions in 64 or 96. Each length and batch bucket costs one XLA compilation (seconds on a CPU).
        self.length_buckets = tuple(b for b in (16, 32, 64, 96) if b < model.encoder_length) + (model.encoder_length,)
        # Keyed by plans a user picks: bounded, so sweeping valid options cannot grow memory.
        self._compiled, self._prepare_graphs = CompiledCache(COMPILED_KEPT), CompiledCache(COMPILED_KEPT)
        self._stream_graphs = CompiledCache(COMPILED_KEPT)
        self._provenance = Provenance(retriever)
        # which pieces begin a word, for `tidy` (a model driven by ids alone, without a tokenizer: none)
        self.word_starts = (tf.constant(tokenizer.word_starts()) if tokenizer is not None
                            else tf.zeros([model.vocab_size], tf.bool))
        # a streamed reply's growing prefix (padded) through the `tidy` its whole reply gets: one traced graph
        self._tidy_parts = tf.function(lambda ids: tidy_parts(ids, self.word_starts), autograph=False,
                                       input_signature=[tf.TensorSpec([None, self.max_length], tf.int32)])
        # whether a streamed question gets the fallback: one traced graph, not the encoder op by op each time
        self._confident = None if retriever is None else tf.function(
            retriever.confident, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
        self._seeds = random.Random()  # its own: code that reseeds Python's `random` (training) leaves it alone
        # Asked for and with e5 loaded, a crisis is also recognised by meaning (`chatbot.safety.meaning`), after the list
        self.crisis_head, self._crisis_classes = None, None
        if retriever is not None and retriever.config.pretrained:  # the message's e5 pass: XLA where loops are
            retriever.pretrained.jit = self.compilation in (Compilation.XLA, Compilation.WARMED)
        if crisis_by_meaning and retriever is not None and retriever.config.pretrained:
            from chatbot.safety.meaning import REPLIES, load_head

            self.crisis_head, self._crisis_replies = load_head(), REPLIES
            self._crisis_classes = tf.function(
                lambda messages: self.crisis_head.classes(retriever.pretrained.message_vectors(messages)),
                input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)

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
            texts = [with_context(text, check_history(history), self.context.turns)
                     for text, history in zip(texts, histories)]
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
        "content": str}` messages, oldest first) as the one string the model reads (`chatbot.data.text.with_context`).
        Raises ValueError for a bad question or history."""
        (text,) = check_questions([text])
        return with_context(text, check_history(history), self.context.turns)

    def plan(self, settings: GenerationConfig, jit: bool | None = None) -> Plan:
        """The static options of checked `settings`; `jit` None: as `compilation` says."""
        retrievable = 0 if self.retriever is None else len(self.retriever)
        if jit is None and self.compilation is Compilation.WARMED:
            compiled = Plan.of(settings, retrievable, jit=True)
            return compiled if compiled in self.warmed else Plan.of(settings, retrievable, jit=False)
        return Plan.of(settings, retrievable, self.compilation is Compilation.XLA if jit is None else jit)

    def options(self, settings: GenerationConfig) -> Options:
        """The tensors of checked `settings`, with a fresh seed when they name none."""
        seed = settings.seed if settings.seed is not None else self._seeds.randrange(2**31 - 1)
        return Options.of(settings, self.max_length, seed)

    # -- the public API: validate, run, postprocess --

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
        """The replies to a checked request: its plan's compiled function, then `postprocess`."""
        if not request.texts:
            return []
        ids, strings = self.generate(request.texts, request.tones, self.options(request.settings), request.plan)
        return self.postprocess(request.texts, ids, strings)

    def reply_ids(self, texts: list[str], tone=None, settings: GenerationConfig | None = None,
                  **decoding) -> np.ndarray:
        """The reply ids (batch, max_length) of the reply graph: tidied (`tidy`) and the fallback's rows empty,
        before `postprocess`."""
        request = self.request(texts, tone, settings, **decoding)
        return self.generate(request.texts, request.tones, self.options(request.settings), request.plan)[0].numpy()

    def postprocess(self, texts: list[str], ids, strings=None) -> list[str]:
        """Reply ids (batch, max_length), already tidied (`with_fallback`), as the strings users get: detokenized
        (`strings`: the graph's, when at hand), and the fixed crisis reply where the question may signal self-harm,
        suicide or abuse (`chatbot.safety.keywords`): no setting or training row changes it."""
        strings = self.tokenizer.detokenize(ids) if strings is None else strings
        replies = [reply.decode("utf-8") for reply in strings.numpy()]
        return [crisis or reply for crisis, reply in zip(self._crisis(texts), replies)]

    def _crisis(self, texts: list[str]) -> list[str | None]:
        """The crisis reply for each checked text's new message, or None: the list (`chatbot.safety.keywords`) first, then,
        for the messages it leaves and only where the model has e5 loaded, the classifier by meaning
        (`chatbot.safety.meaning`), all of them in one pass."""
        messages = [question_part(text) for text in texts]
        replies = [crisis_reply(message) for message in messages]
        unread = [row for row, reply in enumerate(replies) if reply is None]
        if self._crisis_classes is None or not unread:
            return replies
        classes = self._crisis_classes(tf.constant([normalize(messages[row]) for row in unread])).numpy()
        for row, kind in zip(unread, classes.tolist()):
            replies[row] = self._crisis_replies.get(kind)
        return replies

    def stream(self, text: str, tone=None, settings: GenerationConfig | None = None, history=None,
               **decoding) -> Iterator[str]:
        """Yield the growing reply, one token at a time (each step is one graph call); `history` as for `reply`.
        With beams or `candidates`, whose reply is chosen at the end, it decodes first and then reveals the reply."""
        request = self.request([text], tone, settings, [history], **decoding)
        (text,), (tone,) = request.texts, request.tones
        crisis = self._crisis([text])[0]
        if crisis:  # at once and whole: nothing the model would write first
            yield crisis
            return
        if self.retriever is not None and not bool(self._confident(tf.constant([text]))[0]):
            yield self.retriever.config.fallback  # nothing in training is close enough: say so, whole
            return
        options = self.options(request.settings)
        if request.plan.strategy == "beam" or request.plan.candidates:
            ids = self.generate(request.texts, request.tones, options, request.plan)[0]  # cut as `reply` cuts
            yield from self._revealed(trim(ids.numpy())[0])
            return
        yield from self._streamed_text(self._tokens(text, tone, options, request.plan))

    def _streamed_text(self, tokens: Iterator[int]) -> Iterator[str]:
        """The growing reply as its tokens arrive, each time its text changes ("" for an empty reply). Each prefix
        goes through `tidy` as `reply`'s whole reply does (a stutter said once, so the text may shrink); where the
        prefix is cut, the stream ends with the cut text, what `reply` gives."""
        previous, ids = None, []
        for token in tokens:
            ids.append(token)
            collapsed, cut = self._tidy_parts(np.array([ids + [PAD_ID] * (self.max_length - len(ids))], np.int32))
            collapsed, cut = trim(collapsed.numpy())[0], int(cut[0])
            current = self.tokenizer.join_pieces([self.tokenizer.piece_text(i) for i in collapsed[:cut]])
            if current != previous:
                previous = current
                yield current
            if cut < len(collapsed):
                return
        if previous is None:
            yield ""

    def _revealed(self, ids: list[int]) -> Iterator[str]:
        """A finished reply's ids (trimmed) shown as if streamed: one more piece each time."""
        pieces = [self.tokenizer.piece_text(i) for i in ids]
        for end in range(1, len(pieces) + 1):
            yield self.tokenizer.join_pieces(pieces[:end])

    def provenance(self, text: str, reply: str, history=None) -> dict:
        """Whether `reply` is exactly a training answer and which question it answered (`Provenance`), for `text`
        with the conversation before it (`history`, as for `reply`)."""
        return self._provenance(self.in_context(text, history), reply)

    def attention(self, text: str, reply: str | None = None, tone=None) -> dict:
        """Cross-attention of a reply over the encoder input (the question, and the retrieved answers if
        the model reads them): tokens and weights (layers, heads, reply, encoder input)."""
        request = self.request([text], tone)
        encoder_ids = self.encoder_ids(tf.constant(request.texts), tf.constant(request.tones)).to_tensor()
        if reply is None:
            reply_ids = trim(self.generate(request.texts, request.tones, self.options(request.settings),
                                           request.plan)[0].numpy())[0]
        else:
            reply_ids = self.tokenizer.encode([reply])[0]
        reply_ids = list(reply_ids)[:self.max_length - 1]  # the start token and the reply share the positions
        decoder_ids = tf.constant([[START_ID, *reply_ids]], tf.int32)
        memory = self.model.encode(encoder_ids, training=False)
        _, attention = self.model.decode(decoder_ids, memory, encoder_ids, return_attention=True)
        weights = np.stack([w[0].numpy() for w in attention])  # (layers, heads, reply+1, question)
        return {"reply": self.tokenizer.decode([reply_ids])[0],
                "question_tokens": self.tokenizer.pieces(encoder_ids[0].numpy()),
                "reply_tokens": self.tokenizer.pieces([*reply_ids, END_ID]),
                "weights": weights}

    # -- prepare: strings -> ids (a plain graph) --

    def prepare(self, texts, tones, plan: Plan, min_length=0) -> Prepared:
        """Strings (batch,) and tones (batch,) int (-1 or None: none) -> `Prepared`, in the graph. Encoder ids are
        padded to a length bucket, at least `min_length`: XLA compiles the loop per bucket, not per question.
        One similarity matrix serves both retrieval lookups."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self._tones(texts, tones)
        similarity = self.retriever.similarity(texts) if self.context.retrieved or plan.candidates else None
        ids = self.encoder_ids(texts, tones, similarity).to_tensor()
        width = tf.shape(ids)[1]
        ids = tf.pad(ids, [[0, 0], [0, bucket(tf.maximum(width, min_length), self.length_buckets) - width]])
        confident = (tf.ones(tf.shape(texts), tf.float32) if similarity is None
                     else tf.cast(self.retriever.confident(texts, similarity), tf.float32))
        return Prepared(ids, *self._retrieved(texts, tones, plan.candidates, similarity), confident)

    def encoder_ids(self, texts, tones=None, similarity=None) -> tf.RaggedTensor:
        """Strings (batch,) -> encoder ids (batch, None), unpadded, composed by `pipeline.compose_encoder_inputs`
        as training composes them; the retrieved neighbours come from the index (`similarity`: the questions'
        `Retriever.similarity`, if at hand)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self._tones(texts, tones)
        asked = answers = None
        if self.context.retrieved:
            asked, answers = self.retriever.neighbours(texts, self.context.retrieved, tones, similarity=similarity)
        return compose_encoder_inputs(self.tokenizer.tokenize, texts, tones, self.config, answers, asked)

    def _tones(self, texts, tones):
        """The tones (batch,) int the graph uses: as asked, or -1 (none) when none was asked or none learned."""
        return tf.fill(tf.shape(texts), -1) if tones is None or not self.context.tone else tones

    def _retrieved(self, texts, tones, count: int, similarity):
        """`Prepared.retrieved` and `Prepared.scores`: the answers of the `count` nearest training questions."""
        if not count:
            return tf.zeros([tf.shape(texts)[0], 0, self.max_length], tf.int32), tf.zeros([tf.shape(texts)[0], 0])
        # a reply asked for in a tone is weighed against that tone's answers only
        answers, scores = self.retriever.ranked(texts, count, tones, only_tone=True, similarity=similarity)
        ids = self.tokenizer.tokenize(tf.reshape(answers, [-1]))[:, :self.max_length - 1]
        ids = tf.concat([ids, tf.fill([ids.nrows(), 1], tf.constant(END_ID, ids.dtype))], axis=1)
        ids = tf.cast(ids.to_tensor(shape=[None, self.max_length]), tf.int32)
        return tf.reshape(ids, [-1, count, self.max_length]), scores

    # -- run: the encoder pass and the loop --

    def encode(self, encoder_ids):
        """The encoder's pass as the decoder reads it: each layer's cross-attention keys and values, once."""
        return self.model.cross_cache(self.model.encode(encoder_ids, training=False))

    def start(self, encoder_ids, cross_cache, plan: Plan) -> State:
        """The state before the first step; each question's row repeated `num_beams` times, only the first
        of them alive (the others start at -inf, so the first step does not pick one token twice)."""
        encoder_ids = tf.repeat(encoder_ids, plan.num_beams, axis=0)  # (rows, src_len)
        cross_cache = tf.repeat(cross_cache, plan.num_beams, axis=0)  # projected once per question, not per beam
        rows = tf.shape(encoder_ids)[0]
        tokens = tf.concat([tf.fill([rows, 1], START_ID), tf.fill([rows, self.max_length], PAD_ID)], axis=1)
        scores = tf.where(tf.range(rows) % plan.num_beams == 0, 0.0, NEG_INF)
        seen = tf.zeros([rows, self.model.vocab_size], tf.bool)
        return State(tf.constant(0), tokens, tf.zeros([rows], tf.bool), seen, scores, self.model.empty_cache(rows),
                     cross_cache, encoder_ids)

    def step(self, state: State, options: Options, plan: Plan) -> State:
        """Feed the last token through the key/value cache and let the plan's sampler choose the next one."""
        last = tf.gather(state.tokens, [state.index], axis=1)
        before = tf.gather(state.tokens, [tf.maximum(state.index - 1, 0)], axis=1) * tf.cast(state.index > 0, tf.int32)
        logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                    state.encoder_ids, before)
        return self._advance(state._replace(self_cache=self_cache), logits, options, plan)

    def _advance(self, state: State, logits, options: Options, plan: Plan) -> State:
        """Process the next-token logits (special tokens, repetition penalty, n-gram ban, padding after the end),
        ask the plan's sampler for the next token and write it at index + 1; the cached and the naive decoder
        share it, so they differ only in how the logits are computed."""
        logits = process_logits(logits, state.tokens, state.index, state.seen, state.finished,
                                options.repetition_penalty, options.no_repeat_ngram_size)
        chosen, parents, scores = sampler_for(plan).next(logits, state.scores, state.index, options)
        if plan.num_beams > 1:  # a new row may continue another row of its question: move the rows along
            state = state._replace(tokens=tf.gather(state.tokens, parents), finished=tf.gather(state.finished, parents),
                                   seen=tf.gather(state.seen, parents), self_cache=tf.gather(state.self_cache, parents))
        seen = state.seen | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
        return state._replace(index=state.index + 1, tokens=_write(state.tokens, state.index + 1, chosen),
                              finished=state.finished | (chosen == END_ID), seen=seen, scores=scores)

    def run(self, encoder_ids, cross_cache, options: Options, plan: Plan):
        """The model's own replies (batch, max_length): `step` from `start` until every row ended or `options.steps`;
        for beam search each question's best beam (`best_beams`)."""
        state = tf.while_loop(
            lambda s: (s.index < options.steps) & ~tf.reduce_all(s.finished),
            lambda s: (self.step(s, options, plan),),
            (self.start(encoder_ids, cross_cache, plan),), maximum_iterations=self.max_length)[0]
        return self.best_beams(state, encoder_ids, options, plan)

    def best_beams(self, state: State, encoder_ids, options: Options, plan: Plan):
        """The replies of a finished loop (batch, max_length): for beam search each question's best beam by
        length-normalised score plus the `agreement` and `mbr` terms."""
        replies = state.tokens[:, 1:]
        if plan.num_beams == 1:
            return replies
        replies = tf.reshape(replies, [-1, plan.num_beams, self.max_length])  # (batch, beams, max_length)
        lengths = tf.reduce_sum(tf.cast(replies != PAD_ID, tf.float32), axis=-1)
        scores = tf.reshape(state.scores, [-1, plan.num_beams])
        normalised = scores / tf.maximum(lengths, 1.0) ** options.length_penalty
        normalised += options.agreement * agreement(replies, encoder_ids) + options.mbr * beam_consensus(replies)
        return tf.gather(replies, tf.argmax(normalised, axis=-1, output_type=tf.int32), batch_dims=1)

    def rerank(self, prepared: Prepared, cross_cache, replies, options: Options):
        """Each question's reply chosen among its generated one (batch, max_length) and its retrieved answers,
        by `chatbot.decoding.rerank`'s features and this model's weights."""
        return choose(features(self.model, prepared.encoder_ids, cross_cache, replies, prepared.retrieved,
                               prepared.scores, options.steps, self.rerank_weights), self.rerank_weights)

    def loop(self, prepared: Prepared, options: Options, plan: Plan):
        """Encoder pass, `run` and the optional `rerank`: what a plan compiles."""
        cross_cache = self.encode(prepared.encoder_ids)  # for the loop and the rerank
        replies = self.run(prepared.encoder_ids, cross_cache, options, plan)
        return self.rerank(prepared, cross_cache, replies, options) if plan.candidates else replies

    def with_fallback(self, ids, confident):
        """Reply ids (batch, max_length) and strings (batch,): each reply tidied (`tidy`: a stutter said once, a
        repeated phrase or a runaway loop cut, padding after), and where a question has no training question close enough (`confident` 0), the fallback reply
        (and no ids: nothing of the model's own reply is kept)."""
        unsure = confident < 0.5
        ids = tf.where(unsure[:, None], PAD_ID, tidy(ids, self.word_starts))
        strings = self.tokenizer.detokenize(ids)
        return ids, strings if self.retriever is None else tf.where(unsure, self.retriever.config.fallback, strings)

    def replies_graph(self, texts, tones, options: Options, plan: Plan, min_length=0, prepare=None, loop=None):
        """Prepare, the batch padded to a bucket of rows through the loop, the fallback and detokenizing: reply ids
        (batch, max_length) and strings (batch,). `prepare` and `loop`: their compiled functions, when at hand."""
        prepare = prepare or (lambda *args: self.prepare(*args[:2], plan, args[2]))
        loop = loop or (lambda prepared, opts: self.loop(prepared, opts, plan))
        prepared = prepare(texts, tones, min_length)
        batch = tf.shape(texts)[0]
        rows = bucket(batch, BATCH_BUCKETS)  # a few batch shapes cover every batch size
        padded = Prepared(*(tf.pad(t, [[0, rows - batch]] + [[0, 0]] * (t.shape.rank - 1)) for t in prepared))
        ids = loop(padded, options)[:batch]
        return self.with_fallback(ids, prepared.confident)

    # -- one compiled function per plan --

    def generate(self, texts, tones, options: Options, plan: Plan, min_length: int = 0):
        """Reply ids (batch, max_length) and strings (batch,) through `plan`'s compiled function (op by op when
        `op_by_op(plan)`: for one reply, tracing the loop costs more than running it)."""
        texts, tones = tf.convert_to_tensor(texts, tf.string), tf.convert_to_tensor(tones, tf.int32)
        if self.op_by_op(plan):
            return self.replies_graph(texts, tones, options, plan, tf.constant(min_length))
        return self.compiled(plan)(texts, tones, options, tf.constant(min_length))

    def op_by_op(self, plan: Plan) -> bool:
        """Whether `plan` decodes eagerly: always under EAGER; under WARMED (the app), every plan but the warmed ones
        and the defaults' plain graph. A server's visitors choose the settings, and each new plan traced cost about
        115 MB of the process on the default model and 5-11 s before its first reply; op by op a reply takes
        about a second and traces nothing, so a sweep of settings leaves the server's memory as it was."""
        return self.compilation is Compilation.EAGER or (
            self.compilation is Compilation.WARMED and not plan.jit and plan != self._first_plan)

    def compiled(self, plan: Plan):
        """`plan`'s replies function, built once and kept in a bounded cache: a plain graph holding its prepare (a
        graph shared by every plan with its candidate count, so a new plan traces only its loop) and its loop
        (XLA when `plan.jit`, compiled once per batch and length bucket it meets)."""
        return self._compiled.get(plan, lambda: self._build(plan))

    def _build(self, plan: Plan):
        prepare = self._prepare_graphs.get(plan.candidates, lambda: self._build_prepare(plan.candidates))
        retrieved = [None, plan.candidates, self.max_length]
        loop_signature = [Prepared(tf.TensorSpec([None, None], tf.int32), tf.TensorSpec(retrieved, tf.int32),
                                   tf.TensorSpec([None, plan.candidates], tf.float32),
                                   tf.TensorSpec([None], tf.float32)), OPTIONS_SIGNATURE]

        def loop(prepared, options):
            return self.loop(prepared, options, plan)

        def replies(texts, tones, options, min_length):
            return self.replies_graph(texts, tones, options, plan, min_length, prepare, compiled_loop)

        compiled_loop = tf.function(loop, jit_compile=plan.jit, autograph=False, input_signature=loop_signature)
        return tf.function(replies, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), OPTIONS_SIGNATURE,
            tf.TensorSpec([], tf.int32)])

    def _prepare_for(self, candidates: int):
        """`prepare` for plans with `candidates` (all that it reads of a plan), as a function of the texts alone."""
        plan = Plan(candidates=candidates)

        def prepare(texts, tones, min_length):
            return self.prepare(texts, tones, plan, min_length)

        return prepare

    def _build_prepare(self, candidates: int):
        return tf.function(self._prepare_for(candidates), autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)])

    def _tokens(self, text: str, tone: int, options: Options, plan: Plan) -> Iterator[int]:
        """One question's reply token by token, as each step chooses it, until it ends or `options.steps`. Streamed
        steps are plain graphs whatever the compilation (op by op where `op_by_op(plan)`): a step is milliseconds
        either way, while an XLA compilation per encoder length would keep the first streamed reply waiting."""
        begin, step = (self._build_stream(plan, traced=False) if self.op_by_op(plan) else
                       self._stream_graphs.get(Plan(plan.strategy, plan.num_beams, plan.candidates),
                                               lambda: self._build_stream(plan)))
        state = begin(tf.constant([text]), tf.constant([tone], tf.int32))
        for _ in range(int(options.steps)):
            state = step(state, options)
            if bool(state.finished[0]):
                return
            yield int(state.tokens[0, int(state.index)])

    def _build_stream(self, plan: Plan, traced: bool = True):
        prepare = (self._prepare_graphs.get(plan.candidates, lambda: self._build_prepare(plan.candidates)) if traced
                   else self._prepare_for(plan.candidates))

        def begin(texts, tones):
            ids = prepare(texts, tones, tf.constant(0)).encoder_ids
            return self.start(ids, self.encode(ids), plan)

        def step(state, options):
            return self.step(state, options, plan)

        if not traced:
            return begin, step
        return tf.function(begin, autograph=False), tf.function(step, autograph=False)

    # -- compile latency: every warm-up and background trace --

    @property
    def compiled_plans(self) -> list[Plan]:
        """The plans whose compiled functions are kept, least recently used first."""
        return list(self._compiled)

    def ready(self, plan: Plan) -> bool:
        """Whether a reply with `plan` runs at once, with no graph to trace first: a request whose plan is not
        ready would make a batch wait seconds for the trace."""
        function = self._compiled.peek(plan)
        return self.compilation is Compilation.EAGER or (
            function is not None and function.experimental_get_tracing_count() > 0)

    def warm_up(self, rows=BATCH_BUCKETS[:5], settings: GenerationConfig | None = None, **decoding) -> None:
        """Compile everything a reply with these settings needs, for batches of `rows` and every encoder length
        (the web app does it at start, in the background, up to its `ReplyBatcher`'s largest batch, 16), through
        the replies function as requests call it (XLA shares no compilation between a function alone and inside a
        graph). Under `Compilation.WARMED`, requests with this plan use XLA only from then on: none waits for it."""
        request = self.request([], None, settings, **decoding)
        options = self.options(request.settings)
        plan = self.plan(request.settings, jit=self.compilation in (Compilation.XLA, Compilation.WARMED))
        for length in self.length_buckets:
            for count in rows:
                self.generate(["안녕"] * count, [-1] * count, options, plan, min_length=length)
        self.warmed.add(plan)

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

    # -- the test oracle --

    def naive_reply(self, text: str, tone=None, settings: GenerationConfig | None = None, **decoding) -> str:
        """The reply decoded the seed tutorial's way: the whole model re-run on the whole prefix for every new token,
        no key/value cache, no compiled loop, one question at a time, eagerly. Any strategy (greedy, seeded sampling,
        beam search); the tokens are chosen by the same sampler as the cached loop's (`_advance`), so the two must
        agree. `candidates` is left out: the rerank it adds runs on the finished replies. Slow on purpose: the
        oracle the cached engine is tested against."""
        request = self.request([text], tone, settings, **decoding)
        options, plan = self.options(request.settings), Plan.of(request.settings, 0, jit=False)
        prepared = self.prepare(tf.constant(request.texts), tf.constant(request.tones), plan)
        encoder_ids = prepared.encoder_ids
        state = self.start(encoder_ids, tf.zeros([1, 0]), plan)
        state = state._replace(self_cache=tf.zeros([tf.shape(state.tokens)[0], 0]),
                               cross_cache=tf.zeros([tf.shape(state.tokens)[0], 0]))
        while int(state.index) < int(options.steps) and not bool(tf.reduce_all(state.finished)):
            prefix = state.tokens[:, :int(state.index) + 1]
            logits = self.model((state.encoder_ids, prefix), training=False)[:, -1]
            state = self._advance(state, logits, options, plan)
        ids, strings = self.with_fallback(self.best_beams(state, encoder_ids, options, plan), prepared.confident)
        return self.postprocess(request.texts, ids, strings)[0]


def _write(tokens, position, values):
    """tokens[:, position] = values, in a form XLA compiles (no dynamic scatter)."""
    column = tf.range(tf.shape(tokens)[1])[None] == position
    return tf.where(column, values[:, None], tokens)

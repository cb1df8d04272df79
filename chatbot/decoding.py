"""The decoding room: three stages over one model and tokenizer, and the compiled functions of each plan.

Owns: `CachedDecoder`, whose stages are `prepare` (strings -> encoder ids padded to a few bucket lengths, and
the retrieved candidate answers: tokenizing and retrieval, in plain graphs since XLA cannot compile string
ops), `run` (the key/value-cached `tf.while_loop` over `step`, one step function for every sampler, with beam
ranking and the optional `agreement` and `mbr` rescoring) and the optional `rerank` (the generated reply
weighed against the retrieved answers with `chatbot.rerank`); the loop's `State`; and `PlanGraphs`, the graph
functions of one `chatbot.plan.Plan`, kept in one bounded cache keyed by the plan. Must not know about
Python-side strings, seeds or user errors: that is `chatbot.generate.Chatbot`'s job.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, NamedTuple

import tensorflow as tf

from chatbot.compiled import CompiledCache
from chatbot.config import NO_CONTEXT, ContextConfig, GenerationConfig, RerankConfig
from chatbot.pipeline import bucket, encoder_inputs, split_turns
from chatbot.plan import OPTIONS_SIGNATURE, Options, Plan
from chatbot.rerank import agreement, beam_consensus, choose, features
from chatbot.samplers import NEG_INF, process_logits, sampler_for
from chatbot.tokenizer import END_ID, PAD_ID, START_ID, Tokenizer

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batches are padded to these many rows (XLA shapes)
COMPILED_KEPT = 8  # plans whose compiled functions are kept (the defaults and a few others)


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
    """What `prepare` hands the compiled stages, one row per question."""

    encoder_ids: tf.Tensor  # (batch, src_len), padded with 0 to a length bucket
    retrieved: tf.Tensor  # (batch, candidates, max_length): retrieved answers as reply ids, ended by END_ID
    scores: tf.Tensor  # (batch, candidates): their retrieval scores
    confident: tf.Tensor  # (batch,) float32: 1 where a training question is close enough (else the fallback)


class CachedDecoder:
    """Cached decoding over one model and tokenizer, for `Chatbot` and the SavedModel export. Every stage takes
    its inputs, then `Options`, then the `Plan`. With a `retriever`, the encoder also reads retrieved answers."""

    def __init__(self, model, tokenizer: Tokenizer, context: ContextConfig = NO_CONTEXT, retriever=None,
                 jit_compile: bool | str = True, rerank: RerankConfig = RerankConfig()):
        self.model, self.tokenizer, self.context, self.retriever = model, tokenizer, context, retriever
        self.rerank_weights, self.max_length = rerank, model.max_length
        if context.retrieved and retriever is None:
            raise ValueError("this model reads retrieved answers: it needs its retrieval index")
        self.jit_compile, self._warmed = jit_compile, set()  # True, False, "warmed" (XLA once warmed up) or "eager"
        # A question alone fits in 16 tokens, most with a retrieved answer in 32, with two retrieved pairs and
        # their questions in 64 or 96. Each length and batch bucket costs one XLA compilation (seconds on a CPU).
        self.length_buckets = tuple(b for b in (16, 32, 64, 96) if b < model.encoder_length) + (model.encoder_length,)
        # Keyed by plans a user picks: bounded, so sweeping valid options cannot grow memory.
        self.graphs, self.prepare_graphs = CompiledCache(COMPILED_KEPT), CompiledCache(COMPILED_KEPT)

    def plan(self, settings: GenerationConfig, jit: bool | None = None) -> Plan:
        """The static options of checked `settings`. `jit` None: as `jit_compile` says (with "warmed", XLA only
        for a plan `warm_up` compiled, so no request waits for a compilation)."""
        retrievable = 0 if self.retriever is None else len(self.retriever)
        if jit is None and self.jit_compile == "warmed":
            compiled = Plan.of(settings, retrievable, jit=True)
            return compiled if compiled in self._warmed else dataclasses.replace(compiled, jit=False)
        return Plan.of(settings, retrievable, self.jit_compile is True if jit is None else jit)

    # -- prepare: strings -> ids (plain graph) --

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
        """Strings (batch,) -> encoder ids (batch, None), unpadded: the question, its tone token if the model
        learned tones, the messages before it if the model reads them, and the retrieved answers (`similarity`: the questions' `Retriever.similarity`, if at hand)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self._tones(texts, tones)
        context = context_questions = None
        if self.context.retrieved:
            asked, answers = self.retriever.neighbours(texts, self.context.retrieved, tones, similarity=similarity)
            width = tf.shape(answers, out_type=tf.int64)[1]  # (batch, k)
            context = tf.RaggedTensor.from_uniform_row_length(self.tokenizer.tokenize(tf.reshape(answers, [-1])), width)
            if self.context.questions:
                context_questions = tf.RaggedTensor.from_uniform_row_length(
                    self.tokenizer.tokenize(tf.reshape(asked, [-1])), width)
        question, turns = split_turns(self.tokenizer.tokenize, texts, self.context.turns)
        return encoder_inputs(question, self.max_length, tones if self.context.tone else None,
                              context, self.model.encoder_length, context_questions, turns)

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

    def with_fallback(self, ids, confident):
        """Reply ids (batch, max_length) and strings (batch,), where a question with no training question close
        enough (`confident` 0) gets the fallback reply (and no ids: nothing of the model's own reply is kept)."""
        unsure = confident < 0.5
        ids = tf.where(unsure[:, None], PAD_ID, ids)
        strings = self.tokenizer.detokenize(ids)
        return ids, strings if self.retriever is None else tf.where(unsure, self.retriever.config.fallback, strings)

    # -- run: the encoder pass and the loop (XLA when the plan says so) --

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
        """Feed the last token, let the plan's sampler choose the next one, write it at index + 1."""
        last = tf.gather(state.tokens, [state.index], axis=1)
        before = tf.gather(state.tokens, [tf.maximum(state.index - 1, 0)], axis=1) * tf.cast(state.index > 0, tf.int32)
        logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                    state.encoder_ids, before)
        logits = process_logits(logits, state.tokens, state.index, state.seen, state.finished,
                                options.repetition_penalty, plan.no_repeat_ngram_size)
        chosen, parents, scores = sampler_for(plan).next(logits, state.scores, state.index, options)
        state = state._replace(self_cache=self_cache)
        if plan.num_beams > 1:  # a new row may continue another row of its question: move the rows along
            follow = lambda t: tf.gather(t, parents)  # noqa: E731
            state = state._replace(tokens=follow(state.tokens), finished=follow(state.finished),
                                   seen=follow(state.seen), self_cache=follow(state.self_cache))
        seen = state.seen | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
        return state._replace(index=state.index + 1, tokens=_write(state.tokens, state.index + 1, chosen),
                              finished=state.finished | (chosen == END_ID), seen=seen, scores=scores)

    def run(self, encoder_ids, cross_cache, options: Options, plan: Plan):
        """The model's own replies (batch, max_length): `step` from `start` until every row ended or `options.steps`;
        for beam search each question's best beam by length-normalised score plus `agreement` and `mbr` terms."""
        state = tf.while_loop(
            lambda s: (s.index < options.steps) & ~tf.reduce_all(s.finished),
            lambda s: (self.step(s, options, plan),),
            (self.start(encoder_ids, cross_cache, plan),), maximum_iterations=self.max_length)[0]
        replies = state.tokens[:, 1:]
        if plan.num_beams == 1:
            return replies
        replies = tf.reshape(replies, [-1, plan.num_beams, self.max_length])  # (batch, beams, max_length)
        lengths = tf.reduce_sum(tf.cast(replies != PAD_ID, tf.float32), axis=-1)
        scores = tf.reshape(state.scores, [-1, plan.num_beams])
        normalised = scores / tf.maximum(lengths, 1.0) ** options.length_penalty
        normalised += options.agreement * agreement(replies, encoder_ids) + options.mbr * beam_consensus(replies)
        return tf.gather(replies, tf.argmax(normalised, axis=-1, output_type=tf.int32), batch_dims=1)

    # -- rerank (optional) --

    def rerank(self, prepared: Prepared, cross_cache, replies, options: Options):
        """Each question's reply chosen among its generated one (batch, max_length) and its retrieved answers,
        by `chatbot.rerank`'s features and this model's weights."""
        return choose(features(self.model, prepared.encoder_ids, cross_cache, replies, prepared.retrieved,
                               prepared.scores, options.steps, self.rerank_weights), self.rerank_weights)

    # -- the compiled functions, one set per plan --

    def ready(self, plan: Plan) -> bool:
        """Whether `replies` with `plan` runs without tracing first (its graph is built and traced): a request
        with a plan that is not ready would make a batch wait seconds for the trace."""
        graphs = self.graphs.peek(plan)
        replies = graphs.built.get("replies") if graphs is not None else None
        return self.jit_compile == "eager" or (replies is not None and replies.experimental_get_tracing_count() > 0)

    def graphs_for(self, plan: Plan) -> "PlanGraphs":
        return self.graphs.get(plan, lambda: PlanGraphs(self, plan))

    def replies(self, texts, tones, options: Options, plan: Plan, min_length: int = 0):
        """Reply ids (batch, max_length) and strings (batch,): the three stages in `plan`'s graph."""
        return self.graphs_for(plan).replies(tf.convert_to_tensor(texts, tf.string),
                                             tf.convert_to_tensor(tones, tf.int32), options, tf.constant(min_length))

    def warm_up(self, options: Options, plan: Plan, rows) -> None:
        """Compile `plan`'s loop for every encoder length and these batch buckets, through `replies` as requests
        do (XLA shares no compilation between a function alone and inside a graph). With jit_compile "warmed",
        requests with this plan use XLA only from then on: none waits for it."""
        for length in self.length_buckets:
            for count in rows:
                self.replies(["안녕"] * count, [-1] * count, options, plan, min_length=length)
        self._warmed.add(plan)


class PlanGraphs:
    """The graph functions one `Plan` decodes with, each built on first use and traced once with open batch
    and length dimensions: `replies` (`prepare`, the padded batch through `loop`, detokenizing: one plain graph,
    whose `prepare` is a graph shared by the plans with its candidate count),
    `loop` (encoder pass, `run` and `rerank`; XLA when `plan.jit`, compiled once per shape it meets), and for
    streaming `begin` and `step`, plain graphs whatever the plan: a compilation costs seconds per encoder
    length on a CPU, which the first streamed reply would wait for, while a step is milliseconds either way."""

    def __init__(self, decoder: CachedDecoder, plan: Plan):
        self.decoder, self.plan = decoder, plan
        self.built = {}  # name -> tf.function

    def _function(self, name: str, build):
        function = self.built.get(name)
        return function if function is not None else self.built.setdefault(name, build())

    def _loop(self, prepared: Prepared, options: Options):
        """Encoder pass, `run` and `rerank`: what `loop` compiles."""
        cross_cache = self.decoder.encode(prepared.encoder_ids)  # for the loop and the rerank
        replies = self.decoder.run(prepared.encoder_ids, cross_cache, options, self.plan)
        return self.decoder.rerank(prepared, cross_cache, replies, options) if self.plan.candidates else replies

    def _prepare(self, texts, tones, min_length) -> Prepared:
        return self.decoder.prepare(texts, tones, self.plan, min_length)

    @property
    def prepare(self):
        """`prepare` as one graph per candidate count (all it reads of a plan), which the `replies` graphs of
        every plan with that count call: a new plan traces only its own loop, not tokenizing and retrieval."""
        decoder, plan = self.decoder, Plan(candidates=self.plan.candidates)  # not this plan: it may be evicted
        signature = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), tf.TensorSpec([], tf.int32)]
        return decoder.prepare_graphs.get(plan.candidates, lambda: tf.function(
            lambda texts, tones, min_length: decoder.prepare(texts, tones, plan, min_length), autograph=False,
            input_signature=signature))

    def _replies(self, texts, tones, options: Options, min_length, loop, prepare):
        """Prepare, the padded batch through `loop`, detokenizing: what `replies` traces."""
        prepared = prepare(texts, tones, min_length)
        batch = tf.shape(texts)[0]
        rows = bucket(batch, BATCH_BUCKETS)  # a few batch shapes cover every batch size
        padded = Prepared(*(tf.pad(t, [[0, rows - batch]] + [[0, 0]] * (t.shape.rank - 1)) for t in prepared))
        ids = loop(padded, options)[:batch]
        return self.decoder.with_fallback(ids, prepared.confident)

    @property
    def loop(self):
        plan, max_length = self.plan, self.decoder.max_length
        signature = [Prepared(tf.TensorSpec([None, None], tf.int32),
                              tf.TensorSpec([None, plan.candidates, max_length], tf.int32),
                              tf.TensorSpec([None, plan.candidates], tf.float32),
                              tf.TensorSpec([None], tf.float32)), OPTIONS_SIGNATURE]
        return self._function("loop", lambda: tf.function(self._loop, jit_compile=plan.jit, autograph=False,
                                                          input_signature=signature))

    @property
    def replies(self):
        if self.decoder.jit_compile == "eager":
            # op by op, for a process that answers once: tracing the loop costs twice the CPU of running it once
            return lambda *args: self._replies(*args, self._loop, self._prepare)
        signature = [tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), OPTIONS_SIGNATURE,
                     tf.TensorSpec([], tf.int32)]
        return self._function("replies", lambda: tf.function(
            lambda texts, tones, options, min_length: self._replies(texts, tones, options, min_length, self.loop,
                                                                    self.prepare),
            autograph=False, input_signature=signature))

    @property
    def begin(self):
        decoder, plan = self.decoder, self.plan

        def begin(texts, tones):
            ids = self.prepare(texts, tones, tf.constant(0)).encoder_ids
            return decoder.start(ids, decoder.encode(ids), plan)

        return self._function("begin", lambda: tf.function(begin, autograph=False))

    @property
    def step(self):
        return self._function("step", lambda: tf.function(
            lambda state, options: self.decoder.step(state, options, self.plan), autograph=False))

    def tokens(self, text: str, tone: int, options: Options) -> Iterator[int]:
        """One question's reply token by token, as each step chooses it, until it ends or `options.steps`."""
        state = self.begin(tf.constant([text]), tf.constant([tone], tf.int32))
        for _ in range(int(options.steps)):
            state = self.step(state, options)
            if bool(state.finished[0]):
                return
            yield int(state.tokens[0, int(state.index)])


def _write(tokens, position, values):
    """tokens[:, position] = values, in a form XLA compiles (no dynamic scatter)."""
    column = tf.range(tf.shape(tokens)[1])[None] == position
    return tf.where(column, values[:, None], tokens)

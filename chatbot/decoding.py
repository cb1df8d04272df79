"""The compiled decoding loop: key/value-cached, one step function for every sampler, XLA.

Owns: `CachedDecoder` (composing the encoder input in the graph, padding batches and encoder inputs
to a few bucket shapes, the encoder pass and the whole `tf.while_loop` compiled with XLA, beam
ranking with the optional `agreement` and `mbr` rescoring, and `rerank`: the generated reply weighed against
the retrieved answers with `chatbot.rerank`), the decoding options as tensors (`Options`) and the
loop's `State`. Tokenizing, retrieval and detokenizing stay outside the XLA part, in plain
`tf.function`s, since XLA cannot compile string ops. Must not know about Python-side strings,
seeds or user errors: that is `chatbot.generate.Chatbot`'s job.
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from chatbot.compiled import CompiledCache
from chatbot.config import NO_CONTEXT, ContextConfig, GenerationConfig, RerankConfig
from chatbot.pipeline import bucket, encoder_inputs
from chatbot.rerank import Features, agreement, beam_consensus, choose, features
from chatbot.samplers import NEG_INF, GreedySampler, Sampler, process_logits, sampler_for
from chatbot.tokenizer import END_ID, PAD_ID, START_ID, Tokenizer


BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batches are padded to these many rows (XLA shapes)
COMPILED_KEPT = 8  # decoding settings whose compiled functions are kept (the defaults and a few others)


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


OPTIONS_SIGNATURE = Options(*(tf.TensorSpec([], dtype) for dtype in (
    tf.int32, tf.float32, tf.int32, tf.float32, tf.float32, tf.float32, tf.float32, tf.float32, tf.int32)))


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


class CachedDecoder:
    """Compiled cached decoding over one model and tokenizer, shared by `Chatbot` and the SavedModel
    export. One step function and one loop serve every sampler (see `chatbot.samplers.Sampler`).
    With a `retriever`, the encoder also reads the answers of the nearest training questions."""

    def __init__(self, model, tokenizer: Tokenizer, context: ContextConfig = NO_CONTEXT, retriever=None,
                 jit_compile: bool = True, rerank: RerankConfig = RerankConfig()):
        self.model, self.tokenizer, self.context, self.retriever = model, tokenizer, context, retriever
        self.rerank_weights = rerank
        if context.retrieved and retriever is None:
            raise ValueError("this model reads retrieved answers: it needs its retrieval index")
        self.max_length = model.max_length
        self.jit_compile = jit_compile  # True, False, or "warmed": XLA only for settings `warm_up` compiled
        self._warmed = set()
        # Few encoder lengths: a question alone fits in 16 tokens, most with a retrieved answer in 32, with
        # two retrieved pairs and their questions in 64 or 96.
        # Each length and batch bucket costs one XLA compilation (seconds on a CPU).
        self.length_buckets = tuple(b for b in (16, 32, 64, 96) if b < model.encoder_length) + (model.encoder_length,)
        # Keyed by static settings a user picks: bounded, so sweeping valid options cannot grow memory.
        self._compiled, self._loops = CompiledCache(COMPILED_KEPT), CompiledCache(COMPILED_KEPT)

    def step_limit(self, max_new_tokens: int) -> int:
        """How many tokens a reply may get: what was asked for, within the model's positions."""
        return min(max_new_tokens, self.max_length)

    def encoder_ids(self, texts, tones=None, similarity=None) -> tf.RaggedTensor:
        """Strings (batch,) and tones (batch,) int (-1: none) -> encoder ids (batch, None), in the graph:
        the question, its tone token if the model learned tones, and the retrieved answers (`similarity`:
        the questions' `Retriever.similarity`, if the caller has it)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        tones = self.asked_tones(texts, tones)
        context = context_questions = None
        if self.context.retrieved:
            asked, answers = self.retriever.neighbours(texts, self.context.retrieved, tones, similarity=similarity)
            width = tf.shape(answers, out_type=tf.int64)[1]  # (batch, k)
            context = tf.RaggedTensor.from_uniform_row_length(self.tokenizer.tokenize(tf.reshape(answers, [-1])), width)
            if self.context.questions:
                context_questions = tf.RaggedTensor.from_uniform_row_length(
                    self.tokenizer.tokenize(tf.reshape(asked, [-1])), width)
        return encoder_inputs(self.tokenizer.tokenize(texts), self.max_length, tones if self.context.tone else None,
                              context, self.model.encoder_length, context_questions)

    def asked_tones(self, texts, tones):
        """The tones (batch,) int the graph uses: as asked, or -1 (none) when none was asked or none learned."""
        if tones is None or not self.context.tone:
            return tf.fill(tf.shape(texts), -1)
        return tones

    def encode_texts(self, texts, tones=None, similarity=None, min_length=0):
        """`encoder_ids` padded with 0 to a length bucket (`length_buckets`), at least `min_length`: (batch,
        src_len). A few lengths cover every question, so XLA compiles the decoding loop a few times, not
        per question."""
        ids = self.encoder_ids(texts, tones, similarity).to_tensor()
        width = tf.shape(ids)[1]
        return tf.pad(ids, [[0, 0], [0, bucket(tf.maximum(width, min_length), self.length_buckets) - width]])

    def encoded(self, encoder_ids):
        """The encoder's pass over `encoder_ids`, as the decoder reads it: every layer's cross-attention keys
        and values (`Transformer.cross_cache`), projected once per question for the loop and the rerank pass."""
        return self.model.cross_cache(self.model.encode(encoder_ids, training=False))

    def start(self, encoder_ids, num_beams: int = 1, cross_cache=None) -> State:
        """The state before the first step; each question's row repeated `num_beams` times, only the
        first of them alive (the others start at -inf, so the first step does not pick one token twice).
        `cross_cache`: `encoded(encoder_ids)`, if the caller has it already."""
        if cross_cache is None:
            cross_cache = self.encoded(encoder_ids)
        encoder_ids = tf.repeat(encoder_ids, num_beams, axis=0)  # (rows, src_len)
        cross_cache = tf.repeat(cross_cache, num_beams, axis=0)  # projected once per question, not per beam
        rows = tf.shape(encoder_ids)[0]
        self_cache = self.model.empty_cache(rows)
        tokens = tf.concat([tf.fill([rows, 1], START_ID), tf.fill([rows, self.max_length], PAD_ID)], axis=1)
        scores = tf.where(tf.range(rows) % num_beams == 0, 0.0, NEG_INF)
        seen = tf.zeros([rows, self.model.vocab_size], tf.bool)
        return State(tf.constant(0), tokens, tf.zeros([rows], tf.bool), seen, scores, self_cache, cross_cache,
                     encoder_ids)

    def step(self, state: State, options: Options, sampler: Sampler, no_repeat_ngram_size: int) -> State:
        """Feed the last token, let the sampler choose the next one, write it at index + 1."""
        last = tf.gather(state.tokens, [state.index], axis=1)
        logits, self_cache = self.model.decode_step(last, state.index, state.self_cache, state.cross_cache,
                                                    state.encoder_ids)
        logits = process_logits(logits, state.tokens, state.index, state.seen, state.finished,
                                options.repetition_penalty, no_repeat_ngram_size)
        chosen, parents, scores = sampler.next(logits, state.scores, state.index, options)
        state = state._replace(self_cache=self_cache)
        if sampler.num_beams > 1:  # a new row may continue another row of its question: move the rows along
            follow = lambda t: tf.gather(t, parents)  # noqa: E731
            state = state._replace(tokens=follow(state.tokens), finished=follow(state.finished),
                                   seen=follow(state.seen), self_cache=follow(state.self_cache))
        seen = state.seen | tf.one_hot(chosen, self.model.vocab_size, on_value=True, off_value=False)
        return state._replace(index=state.index + 1, tokens=_write(state.tokens, state.index + 1, chosen),
                              finished=state.finished | (chosen == END_ID), seen=seen, scores=scores)

    def candidate_count(self, candidates: int) -> int:
        """How many retrieved answers `rerank` weighs for a `candidates` setting (none without an index)."""
        return 0 if self.retriever is None else min(candidates, len(self.retriever))

    def similarity(self, texts, candidates: int):
        """The questions' `Retriever.similarity` when the encoder input or `candidates` need it, else None:
        computed once for both lookups."""
        if self.context.retrieved or self.candidate_count(candidates):
            return self.retriever.similarity(texts)
        return None

    def retrieved_candidates(self, texts, tones, count: int, similarity=None):
        """The answers of the `count` nearest training questions as reply ids (batch, count', max_length),
        each ended by the end token as a decoded reply is, and their retrieval scores (batch, count')."""
        texts = tf.convert_to_tensor(texts, tf.string)
        count = self.candidate_count(count)
        if not count:
            return tf.zeros([tf.shape(texts)[0], 0, self.max_length], tf.int32), tf.zeros([tf.shape(texts)[0], 0])
        # a reply asked for in a tone is weighed against that tone's answers only
        answers, scores = self.retriever.ranked(texts, count, self.asked_tones(texts, tones), only_tone=True,
                                                similarity=similarity)
        ids = self.tokenizer.tokenize(tf.reshape(answers, [-1]))[:, :self.max_length - 1]
        ids = tf.concat([ids, tf.fill([ids.nrows(), 1], tf.constant(END_ID, ids.dtype))], axis=1)
        ids = tf.cast(ids.to_tensor(shape=[None, self.max_length]), tf.int32)
        return tf.reshape(ids, [-1, count, self.max_length]), scores

    def decode(self, texts, options: Options, sampler: Sampler, no_repeat_ngram_size: int, tones=None,
               candidates: int = 0, min_length=0, jit: bool | None = None):
        """Strings (batch,) -> reply ids (batch, max_length), padded after the end token, in the graph.
        Tokenizing and retrieval (one similarity matrix for both lookups) run here; the encoder pass and the
        whole loop run in `loop`, compiled with XLA, on a batch padded to a bucket (`BATCH_BUCKETS`) so a few
        shapes cover every batch size.
        `candidates` > 0: the reply is `rerank`'s choice among the generated one and that many retrieved answers.
        `min_length`: the least encoder length bucket (what `warm_up` compiles)."""
        texts = tf.convert_to_tensor(texts, tf.string)
        similarity = self.similarity(texts, candidates)
        encoder_ids = self.encode_texts(texts, tones, similarity, min_length)
        retrieved, scores = self.retrieved_candidates(texts, tones, candidates, similarity)
        batch = tf.shape(encoder_ids)[0]
        rows = bucket(batch, BATCH_BUCKETS)
        pad = lambda t: tf.pad(t, [[0, rows - batch]] + [[0, 0]] * (t.shape.rank - 1))  # noqa: E731
        loop = self.loop(sampler, no_repeat_ngram_size, retrieved.shape[1], jit)
        return loop(pad(encoder_ids), pad(retrieved), pad(scores), options)[:batch]

    def loop(self, sampler: Sampler, no_repeat_ngram_size: int, candidates: int = 0, jit: bool | None = None):
        """`decode_ids` for one sampler, n-gram size, candidate count and `jit`, traced once with open batch and
        length dimensions (XLA compiles it once per shape it meets)."""
        jit = self.jit_compile is True if jit is None else jit
        key = (type(sampler).__name__, sampler.num_beams, no_repeat_ngram_size, candidates, jit)
        return self._loops.get(key, lambda: tf.function(
            lambda ids, retrieved, scores, options: self.decode_ids(ids, options, sampler, no_repeat_ngram_size,
                                                                    retrieved, scores),
            jit_compile=jit, autograph=False, input_signature=[
                tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None, candidates, self.max_length], tf.int32),
                tf.TensorSpec([None, candidates], tf.float32), OPTIONS_SIGNATURE]))

    def decode_ids(self, encoder_ids, options: Options, sampler: Sampler, no_repeat_ngram_size: int,
                   retrieved=None, scores=None):
        """Encoder ids (batch, src_len) -> reply ids (batch, max_length): the encoder once, then the loop;
        then, given retrieved answers (batch, k, max_length) and their scores (batch, k), `rerank`."""
        cross_cache = self.encoded(encoder_ids)  # for the loop and rerank
        replies = self.generated_ids(encoder_ids, cross_cache, options, sampler, no_repeat_ngram_size)
        if retrieved is None or retrieved.shape[1] == 0:
            return replies
        return self.rerank(encoder_ids, cross_cache, replies, retrieved, scores, options)

    def generated_ids(self, encoder_ids, cross_cache, options: Options, sampler: Sampler, no_repeat_ngram_size: int):
        """The model's own reply (batch, max_length): the sampler's, or the best-ranked beam."""
        state = self.start(encoder_ids, sampler.num_beams, cross_cache)
        state = tf.while_loop(
            lambda s: (s.index < options.steps) & ~tf.reduce_all(s.finished),
            lambda s: (self.step(s, options, sampler, no_repeat_ngram_size),),
            (state,), maximum_iterations=self.max_length)[0]
        replies = state.tokens[:, 1:]
        if sampler.num_beams == 1:
            return replies
        replies = tf.reshape(replies, [-1, sampler.num_beams, self.max_length])  # (batch, beams, max_length)
        lengths = tf.reduce_sum(tf.cast(replies != PAD_ID, tf.float32), axis=-1)
        scores = tf.reshape(state.scores, [-1, sampler.num_beams])
        normalised = scores / tf.maximum(lengths, 1.0) ** options.length_penalty
        normalised += options.agreement * agreement(replies, encoder_ids) + options.mbr * beam_consensus(replies)
        return tf.gather(replies, tf.argmax(normalised, axis=-1, output_type=tf.int32), batch_dims=1)

    def rerank(self, encoder_ids, cross_cache, replies, retrieved, scores, options: Options):
        """Choose each question's reply among its generated one (batch, max_length) and its retrieved
        answers (batch, k, max_length), by `chatbot.rerank`'s features and this model's weights."""
        return choose(features(self.model, encoder_ids, cross_cache, replies, retrieved, scores, options.steps,
                               self.rerank_weights), self.rerank_weights)

    def reply_features(self, texts, options: Options, count: int) -> Features:
        """`chatbot.rerank.Features` of each question's greedy reply and `count` retrieved answers (no tone
        asked), in the graph: what fitting the rerank weights weighs."""
        tones = self.asked_tones(texts, None)
        similarity = self.similarity(texts, count)
        encoder_ids = self.encode_texts(texts, tones, similarity)
        cross_cache = self.encoded(encoder_ids)
        replies = self.generated_ids(encoder_ids, cross_cache, options, GreedySampler(), 0)
        retrieved, scores = self.retrieved_candidates(texts, tones, count, similarity)
        return features(self.model, encoder_ids, cross_cache, replies, retrieved, scores, options.steps)

    def warm_up(self, settings: GenerationConfig, options: Options, rows) -> None:
        """Compile the decoding loop for `settings` for every encoder length and these batch buckets, through
        `generate` as requests do (XLA shares no compilation between a function alone and inside a graph).
        With jit_compile "warmed", requests with `settings` use XLA only from then on: none waits for it."""
        for length in self.length_buckets:
            for count in rows:
                self.generate(["안녕"] * count, options, settings, [-1] * count, min_length=length,
                              jit=bool(self.jit_compile))
        self._warmed.add(self.settings_key(settings))  # from now on, requests with these settings take XLA

    def settings_key(self, settings: GenerationConfig) -> tuple:
        """What a compiled decoding function is made for: strategy, beam width, n-gram size, candidates."""
        return (settings.strategy, settings.num_beams if settings.strategy == "beam" else 0,
                settings.no_repeat_ngram_size, self.candidate_count(settings.candidates))

    def generate(self, texts, options: Options, settings: GenerationConfig, tones, min_length: int = 0,
                 jit: bool | None = None):
        """Reply ids (batch, max_length) and strings (batch,) from one graph per `settings_key` and `jit` (None:
        as `jit_compile` says for these settings); detokenizing runs in the graph too."""
        if jit is None:
            jit = self.settings_key(settings) in self._warmed if self.jit_compile == "warmed" else bool(self.jit_compile)
        key = (*self.settings_key(settings), jit)
        def build():
            sampler = sampler_for(settings)

            def generate(texts, options, tones, min_length):
                ids = self.decode(texts, options, sampler, settings.no_repeat_ngram_size, tones, settings.candidates,
                                  min_length, jit)
                return ids, self.tokenizer.detokenize(ids)

            return tf.function(generate, autograph=False, input_signature=[
                tf.TensorSpec([None], tf.string), OPTIONS_SIGNATURE, tf.TensorSpec([None], tf.int32),
                tf.TensorSpec([], tf.int32)])

        return self._compiled.get(key, build)(tf.constant(texts, tf.string), options, tf.constant(tones, tf.int32),
                                              tf.constant(min_length, tf.int32))


def _write(tokens, position, values):
    """tokens[:, position] = values, in a form XLA compiles (no dynamic scatter)."""
    column = tf.range(tf.shape(tokens)[1])[None] == position
    return tf.where(column, values[:, None], tokens)

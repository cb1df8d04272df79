"""Nearest-question retrieval, inside the graph: the training answers a reply can build on, and whether any fits.

Owns: the retrieval index of a model directory (`retrieval.json`: the training pairs); the three similarities it
weighs (`config.RetrievalConfig`): TF-IDF over the characters and character bigrams of the training questions
with cosine similarity (smooth idf, l2-normalised rows, as scikit-learn's TfidfVectorizer with ngram_range (1, 2))
kept as an inverted index (`CharacterIndex`), the same over one document per distinct answer
(`answer_documents`), the cosine of sentence embeddings (`chatbot.model.sentence`), and the cosine of a pretrained
encoder's embeddings (`chatbot.model.pretrained`, multilingual-e5-small) of the message and of each answer document
(`PretrainedIndex`); the in-graph lookup that
decoding and the SavedModel run; a preference for answers of the asked tone; leave-one-out lookups for training
(a question never finds itself, nor any row with the same question); and the fallback's threshold
(`confident`, `calibrated_threshold`). Must not know about the transformer.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import tensorflow as tf

from chatbot.config import CHARACTERS_ONLY, RetrievalConfig
from chatbot.data.pairs import QAPair
from chatbot.model.sentence import SENTENCE_LENGTH, embed
from chatbot.data.text import one_text
from chatbot.data.text_tf import normalize_tf, question_part_tf

# E5's prefixes before a message and before an indexed text: both "query: " (`PretrainedIndex`; chatbot.model.pretrained,
# which holds the encoder, is imported only when a retriever uses it)
PRETRAINED_PREFIXES = ("query: ", "query: ")
# A reply's messages (at most this many) go through the pretrained encoder compiled by XLA, their ids padded to a
# multiple of this many tokens; more (a bulk lookup) through the plain graph, which compiles nothing per shape.
FEW_MESSAGES, ENCODE_LENGTH_STEP = 4, 16
# Added to the cosine similarity of rows whose label is the asked tone: among questions about as
# close, the answer in the asked tone wins; a much closer question of another tone still does.
TONE_BONUS = 0.15
# `ranked(..., only_tone=True)` puts every row of the asked tone before every other row by taking
# this from the others' scores (cosines, at most 1).
OTHER_TONE_PENALTY = 10.0
NO_TONE = -1
CODE_BITS, CODE_MASK = 21, (1 << 21) - 1  # an n-gram as one int64: two Unicode code points (0 before a unigram)
# A character found in more questions than this share (and this count) is not indexed: such characters
# (이, 요, 나, a space) say little about a question, and their postings would make up most of each lookup's work.
COMMON_CHAR_SHARE, COMMON_CHAR_COUNT = 0.05, 100
# Nor is a bigram found in more than this share of the questions (and this count). A lookup expands the postings
# of the message's n-grams, so an n-gram in every question (a template's "question ", "문의 ") made each lookup's
# work, and training's leave-one-out memory, grow with the square of the rows. The bundled data's commonest
# bigram ("이 ") is in 15% of its questions; an FAQ of a few hundred questions is never pruned.
COMMON_BIGRAM_SHARE, COMMON_BIGRAM_COUNT = 0.2, 1000
# Leave-one-out lookups and calibration score this many (message, row) cells at a time at most: a batch of
# 256 messages against 100,000 rows would hold 100 MB per score matrix, and a lookup holds several.
SCORE_CELLS = 1 << 21


def char_bigrams(text: str) -> list[str]:
    """The graph's `tf.strings.ngrams` over characters: a one-character text has none."""
    return [text[i:i + 2] for i in range(len(text) - 1)]


def char_grams(text: str) -> list[str]:
    """What a question is indexed by: its characters, then its character bigrams (less the common characters,
    `tf_idf_postings`). Characters alone match a word however it is spaced or inflected; bigrams keep the order."""
    return list(text) + char_bigrams(text)


def tf_idf_postings(questions: list[str]):
    """The index of `questions` over `char_grams`, less the characters found in more than COMMON_CHAR_SHARE of
    them and more than COMMON_CHAR_COUNT, and the bigrams found in more than COMMON_BIGRAM_SHARE and
    COMMON_BIGRAM_COUNT: the n-gram vocabulary, characters then bigrams, each in code point
    order ([""] when there is none), each n-gram's smooth idf (float32), and its postings, an inverted index:
    n-gram i's rows (int64, ascending) and l2-normalised TF-IDF weights (float32) are at
    [starts[i], starts[i + 1]); rows are the questions' positions. Built with array operations, since every
    model load builds it: a Python loop over 28,000 questions' n-grams took a second of a cold start, these
    take a tenth of that."""
    lengths = np.fromiter(map(len, questions), np.int64, len(questions))
    codes = np.frombuffer("".join(questions).encode("utf-32-le", "surrogatepass"), np.uint32).astype(np.int64)
    owner = np.repeat(np.arange(len(questions)), lengths)  # the question of each character
    inside = owner[:-1] == owner[1:]  # a bigram never spans two questions
    grams = np.concatenate([codes, (codes[:-1] << CODE_BITS | codes[1:])[inside]])
    owner = np.concatenate([owner, owner[:-1][inside]])
    vocabulary, columns = np.unique(grams, return_inverse=True)
    width = max(len(vocabulary), 1)
    entries, counts = np.unique(owner * width + columns, return_counts=True)  # (question, n-gram), each once
    rows, columns = entries // width, entries % width
    found_in = np.bincount(columns, minlength=len(vocabulary))
    unigram = vocabulary >> CODE_BITS == 0
    common = np.where(unigram, found_in > max(COMMON_CHAR_SHARE * len(questions), COMMON_CHAR_COUNT),
                      found_in > max(COMMON_BIGRAM_SHARE * len(questions), COMMON_BIGRAM_COUNT))
    kept = ~common[columns]
    rows, columns, counts = rows[kept], (np.cumsum(~common) - 1)[columns[kept]], counts[kept]
    vocabulary, found_in = vocabulary[~common], found_in[~common]
    size = max(len(vocabulary), 1)
    idf = np.ones(size, np.float32)
    idf[:len(vocabulary)] = np.log((1 + len(questions)) / (1 + found_in)) + 1
    weights = counts * idf[columns].astype(np.float64)
    norms = np.sqrt(np.bincount(rows, weights * weights, minlength=len(questions)))
    weights /= norms[rows]
    order = np.lexsort((rows, columns))  # by n-gram, then question
    starts = np.zeros(size + 1, np.int64)
    np.cumsum(np.bincount(columns, minlength=size), out=starts[1:])
    keys = [(chr(code >> CODE_BITS) if code >> CODE_BITS else "") + chr(code & CODE_MASK)
            for code in vocabulary.tolist()] or [""]
    return keys, idf, starts, rows[order], weights[order].astype(np.float32)


class CharacterIndex(tf.Module):
    """TF-IDF over `char_grams` of some texts, as an inverted index of variables and a lookup table, and the
    cosine similarity of messages to each of them, in the graph."""

    def __init__(self, texts: list[str], name: str):
        super().__init__(name=name)
        keys, idf, starts, rows, weights = tf_idf_postings(texts)
        self.count = len(texts)
        self.table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(
            tf.constant(keys), tf.range(len(keys), dtype=tf.int64)), default_value=-1)
        self.vocabulary_size = len(idf)
        self.idf = tf.Variable(idf, trainable=False, name="idf")
        # n-gram i's postings: [posting_starts[i], posting_starts[i + 1])
        self.posting_starts = tf.Variable(starts, trainable=False, name="posting_starts")
        self.posting_rows = tf.Variable(rows, trainable=False, name="posting_rows")
        self.posting_weights = tf.Variable(weights, trainable=False, name="posting_weights")

    def cosine(self, texts):
        """Normalised messages (batch,) -> cosine similarity to every indexed text (batch, count), in [0, 1]
        (0 for a message with no known character)."""
        grams = tf.strings.ngrams(tf.strings.unicode_split(texts, "UTF-8"), (1, 2), separator="")
        ids = self.table.lookup(grams)
        known = ids.flat_values >= 0
        rows = tf.boolean_mask(ids.value_rowids(), known)
        columns = tf.boolean_mask(ids.flat_values, known)
        batch, size = tf.shape(texts, out_type=tf.int64)[0], tf.constant(self.vocabulary_size, tf.int64)
        # The query's weights: each n-gram once per question, its idf times its count, l2-normalised.
        entries, entry_of = tf.unique(rows * size + columns)
        entry_rows, entry_columns = entries // size, entries % size
        weights = tf.math.unsorted_segment_sum(tf.gather(self.idf, columns), entry_of, tf.size(entries))
        squares = tf.math.unsorted_segment_sum(tf.square(weights), entry_rows, batch)
        weights *= tf.gather(tf.math.rsqrt(tf.maximum(squares, 1e-12)), entry_rows)  # as tf.math.l2_normalize
        # Cosine: summed over the n-grams an indexed text shares with the query, read from the postings of the
        # query's n-grams only (a few thousand entries instead of every text's n-grams).
        starts, ends = tf.gather(self.posting_starts, entry_columns), tf.gather(self.posting_starts, entry_columns + 1)
        hits = tf.ragged.range(starts, ends)  # (entries, None): positions in the postings
        shared = tf.gather(self.posting_weights, hits.flat_values) * tf.repeat(weights, hits.row_lengths())
        targets = tf.repeat(entry_rows, hits.row_lengths()) * self.count + tf.gather(self.posting_rows,
                                                                                     hits.flat_values)
        scores = tf.math.unsorted_segment_sum(shared, targets, batch * self.count)
        return tf.reshape(scores, tf.stack([batch, self.count]))


class PretrainedIndex(tf.Module):
    """multilingual-e5-small's embeddings of some texts (embedded once, here), and the cosine similarity of
    messages (embedded in the graph: the tokenizer and the encoder) to each of them. Both sides carry E5's
    "query: " prefix (PRETRAINED_PREFIXES: bench/retrieval.py, where "query: " before the answer documents found
    more held-out phrasings than "passage: ", and as many FAQ paraphrases). `encoder`: a
    `chatbot.model.pretrained.E5Encoder`; `tokenizer`: the `E5Tokenizer` whose ids it reads. `embeddings`: the texts'
    unit vectors, if the caller has them (rows in `texts`' order; a different shape is embedded again).
    `projection`: a (hidden, hidden) map that both sides pass through, then l2-normalised again (`fit_projection`:
    a model built for its own Q&A learns one from its questions); None: the identity."""

    def __init__(self, texts: list[str], encoder, tokenizer, embeddings: np.ndarray | None = None,
                 projection: np.ndarray | None = None, name: str = "pretrained"):
        super().__init__(name=name)
        from chatbot.model.pretrained import embed as pretrained_embed
        self.encoder, self.tokenizer = encoder, tokenizer
        self.sentencepiece = tokenizer.sp  # a tf.Module: tracked here, as the tokenizer itself is not
        self.message_prefix, indexed_prefix = PRETRAINED_PREFIXES
        if embeddings is None or embeddings.shape != (len(texts), encoder.hidden):
            embeddings = pretrained_embed(encoder, tokenizer, texts, indexed_prefix)
        self.embeddings = tf.Variable(embeddings.astype(np.float32), trainable=False, name="embeddings")
        eye = np.eye(encoder.hidden, dtype=np.float32)
        self.projection = tf.Variable(eye if projection is None else projection.astype(np.float32), trainable=False,
                                      name="projection")
        self.projected = tf.Variable(self.project(self.embeddings), trainable=False, name="projected")
        # About half the time of a reply's pass (12 blocks over a dozen tokens) is the graph's op by op dispatch,
        # which XLA fuses away (bench/pretrained_speed.py); each new (batch, length bucket) compiles once.
        self._compiled = tf.function(self._plain, jit_compile=True, autograph=False)
        self.jit = True  # False: never XLA (a process that answers once: compiling costs more than it saves)

    def cosine(self, texts, vectors=None):
        """Messages (batch,) -> cosine similarity to every indexed text (batch, texts), in [-1, 1], through
        `message_vectors`, or from the messages' `vectors` (batch, hidden) if the caller has them. A text given
        twice (a first message, scored whole and alone) is encoded once."""
        if vectors is not None:
            return tf.matmul(self.project(tf.convert_to_tensor(vectors, tf.float32)), self.projected, transpose_b=True)
        texts, where = tf.unique(tf.convert_to_tensor(texts, tf.string))
        return tf.gather(tf.matmul(self.project(self.message_vectors(texts)), self.projected, transpose_b=True),
                         where)

    def message_vectors(self, texts):
        """Messages (batch,) -> e5's unit vectors (batch, hidden) with the message prefix, before the projection
        (what `chatbot.safety.meaning`'s head reads). A few messages go through the encoder compiled by XLA, their ids
        padded to a bucket of lengths so that a handful of shapes cover every message; a bulk lookup (training,
        calibration) runs it as a plain graph."""
        ids = self.tokenizer.dense(tf.convert_to_tensor(texts, tf.string), self.message_prefix)
        batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
        longest = tf.minimum(-(-length // ENCODE_LENGTH_STEP) * ENCODE_LENGTH_STEP, self.encoder.max_positions)
        padded = tf.pad(ids, [[0, 0], [0, longest - length]], constant_values=self.tokenizer.pad)
        return (tf.cond(batch <= FEW_MESSAGES, lambda: self._compiled(padded), lambda: self._plain(ids))
                if self.jit else self._plain(ids))

    def _plain(self, ids):
        return tf.cast(self.encoder(ids, training=False), tf.float32)

    def project(self, vectors):
        """Unit vectors (n, hidden) through the projection, unit again."""
        return tf.math.l2_normalize(tf.matmul(vectors, self.projection), axis=-1)

    def set_projection(self, projection: np.ndarray):
        self.projection.assign(projection.astype(np.float32))
        self.projected.assign(self.project(self.embeddings))


class Retriever(tf.Module):
    """The answers of the training questions nearest a message. Everything it holds is a variable, a lookup
    table or a Keras layer, so it travels inside a SavedModel.

    Nearness is `RetrievalConfig`'s weighted mean of up to four similarities: the characters the message shares
    with the training question, with the answer's document (`answer_documents`), the cosine of their
    sentence embeddings (`encoder`, a `chatbot.model.sentence.SentenceEncoder`, with the `tokenizer` whose ids it
    reads), and with `pretrained` (an `E5Encoder` and its `E5Tokenizer`, `chatbot.model.pretrained`) the cosine of
    their embeddings of the message and of the answer's document (`PretrainedIndex`). Without an encoder the
    meaning weight must be 0, and without `pretrained` the pretrained weight."""

    def __init__(self, pairs: list[QAPair], config: RetrievalConfig = CHARACTERS_ONLY, encoder=None,
                 tokenizer=None, embeddings: np.ndarray | None = None, pretrained=None,
                 pretrained_embeddings: np.ndarray | None = None, small_talk: list[QAPair] = (),
                 projection: np.ndarray | None = None, hands_on: list[QAPair] = ()):
        super().__init__(name="retriever")
        if not pairs:
            raise ValueError("a retrieval index needs at least one training pair")
        # Small talk (greetings, thanks, goodbyes, questions about the bot) kept from the model this one was built
        # on: indexed after the pairs, each row found only where its score reaches `config.small_talk_threshold`.
        # `hands_on`: the small talk a model built on this one keeps.
        own, self.small_talk = index_rows(pairs, small_talk)
        self.hands_on = tuple(dict.fromkeys(hands_on))
        self.own_rows = len(own)
        pairs = own + self.small_talk
        if config.meaning and (encoder is None or tokenizer is None):
            raise ValueError("retrieval by meaning needs the sentence encoder and its tokenizer")
        if config.pretrained and pretrained is None:
            raise ValueError("retrieval by the pretrained encoder needs it and its tokenizer")
        self.config = config
        # A tuple: tf.Module wraps a list to track each element, which took longer than building the index.
        self.pairs = tuple(dict.fromkeys(pairs))  # a repeated row would only crowd out other candidates
        questions = [one_text(p.question) for p in self.pairs]  # as the graph cleans a message: turns become spaces
        self.characters = CharacterIndex(questions, "characters")
        if config.answers:
            documents, answer_of = answer_documents(self.pairs)
            self.answer_index = CharacterIndex(documents, "answers")
            self.answer_of = tf.Variable(answer_of, trainable=False, name="answer_of")
        self.encoder, self.tokenizer = (encoder, tokenizer) if config.meaning else (None, None)
        if self.encoder is not None:
            if embeddings is None or embeddings.shape != (len(questions), encoder.d_model):  # none saved, or stale
                embeddings = embed(encoder, tokenizer.encode(questions))
            self.embeddings = tf.Variable(embeddings.astype(np.float32), trainable=False, name="embeddings")
        if config.pretrained:  # e5 over the answer documents (bench/retrieval.py: more than over the questions)
            documents, document_of = answer_documents(self.pairs)
            self.pretrained = PretrainedIndex(documents, *pretrained, embeddings=pretrained_embeddings,
                                              projection=projection)
            self.document_of = tf.Variable(document_of, trainable=False, name="document_of")
        # tf.constant: a Variable made from a Python list first checks every element for a tensor to stack
        self.questions = tf.Variable(tf.constant(questions), trainable=False, name="questions")
        self.answers = tf.Variable(tf.constant([p.answer for p in self.pairs]), trainable=False, name="answers")
        self.labels = tf.Variable(tf.constant([NO_TONE if p.label is None else p.label for p in self.pairs],
                                              tf.int32), trainable=False, name="labels")
        self.strict = tf.Variable(tf.range(len(self.pairs)) >= self.own_rows, trainable=False, name="strict")

    def __len__(self) -> int:
        return len(self.pairs)

    def similarity(self, texts, vectors=None):
        """Messages (batch,) -> each training question's score (batch, pairs): the weighted mean of the
        similarities `RetrievalConfig` weighs, each at most 1. A message with the conversation before it
        (`chatbot.data.text.TURN`) is scored as one text and as the new message alone, weighed by
        `RetrievalConfig.conversation`; with `message_wins`, a training question the message alone is nearer to
        keeps that score (a change of topic finds its own neighbours). `vectors`: the pretrained encoder's
        vectors of the messages and of their new messages alone, ((batch, hidden), (batch, hidden)) as
        `message_vectors` gives them, if the caller has them (`bulk_vectors`); else the graph embeds them."""
        texts = tf.convert_to_tensor(texts, tf.string)
        share, either = self.config.conversation, self.config.message_wins
        if share == 1.0 and not either:
            return self._similarity(texts, None if vectors is None else vectors[0])
        message = question_part_tf(texts)
        both = self._similarity(tf.concat([texts, message], axis=0),  # one pass over the index for both
                                None if vectors is None else tf.concat(vectors, axis=0))
        whole, alone = both[:tf.shape(texts)[0]], both[tf.shape(texts)[0]:]
        mixed = alone if share == 0.0 else share * whole + (1.0 - share) * alone
        return tf.maximum(mixed, alone) if either else mixed

    def _similarity(self, texts, vectors=None):
        texts = normalize_tf(texts)
        config = self.config
        scores = config.characters * self.characters.cosine(texts) if config.characters else 0.0
        if config.answers:
            scores += config.answers * tf.gather(self.answer_index.cosine(texts), self.answer_of, axis=1)
        if config.meaning:
            scores += config.meaning * self.meaning(texts)
        if config.pretrained:
            scores += config.pretrained * tf.gather(self.pretrained.cosine(texts, vectors), self.document_of, axis=1)
        scores /= config.total
        if self.own_rows < len(self.pairs):  # below its bar a small-talk row is as far as can be: never a neighbour, never enough
            scores = tf.where(self.strict[None] & (scores < config.small_talk_threshold), -1.0, scores)
        return scores

    def meaning(self, texts):
        """Cosine similarity of the messages' sentence embeddings to every training question's (batch, pairs)."""
        ids = self.tokenizer.tokenize(texts)[:, :SENTENCE_LENGTH].to_tensor()  # padded to the longest, not 32
        return tf.matmul(self.encoder(ids, training=False), self.embeddings, transpose_b=True)

    def without_own_rows(self, texts, scores):
        """`scores` (batch, pairs) with every row of a message's own text far below any other (leave-one-out)."""
        return tf.where(self.questions[None] == normalize_tf(texts)[:, None], -1e9, scores)

    def own_documents(self, questions: list[str]):
        """For each of `questions` that is a training question: its position in `questions`, its answer's document
        (an index) and that document written without it. Returns the three lists."""
        rows, asked = {}, {}
        for row, pair in enumerate(self.pairs[:self.own_rows]):
            rows.setdefault(one_text(pair.question), row)
        for pair in self.pairs:
            asked.setdefault(pair.answer, []).append(one_text(pair.question))
        document_of = self.document_of.numpy()
        positions, documents, without = [], [], []
        for i, question in enumerate(questions):
            row = rows.get(one_text(question))
            if row is not None:
                answer = self.pairs[row].answer
                positions.append(i)
                documents.append(int(document_of[row]))
                without.append(" ".join([*(q for q in asked[answer] if q != one_text(question)), answer]))
        return positions, documents, without

    def own_vectors(self, questions: list[str], vectors: np.ndarray | None = None):
        """`own_documents` as the pretrained encoder's unit vectors: positions, documents, the questions' vectors
        (`vectors`' rows, if the caller has the questions' vectors) and their documents' without them (both
        unprojected)."""
        from chatbot.model.pretrained import embed as pretrained_embed

        positions, documents, without = self.own_documents(questions)
        index = self.pretrained
        asked = (np.asarray(vectors)[positions] if vectors is not None else
                 pretrained_embed(index.encoder, index.tokenizer, [questions[i] for i in positions],
                                  index.message_prefix))
        return (positions, np.array(documents, np.int64), asked,
                pretrained_embed(index.encoder, index.tokenizer, without, PRETRAINED_PREFIXES[1]))

    def bulk_vectors(self, texts: list[str], progress=None) -> tuple[np.ndarray, np.ndarray]:
        """The pretrained encoder's vectors of many messages, and of their new messages alone (`similarity`'s
        `vectors`), each distinct text embedded once, in batches of texts of about one length: a bulk lookup
        (training's leave-one-out) spends most of its time here, and a batch padded to its longest text wastes
        most of it. `progress`: as `chatbot.model.pretrained.embed`'s."""
        from chatbot.model.pretrained import embed as pretrained_embed

        whole = tf.convert_to_tensor(texts, tf.string)
        whole, alone = [[t.decode("utf-8") for t in normalize_tf(x).numpy()] for x in (whole, question_part_tf(whole))]
        distinct = list(dict.fromkeys(whole + alone))
        index = self.pretrained
        vectors = pretrained_embed(index.encoder, index.tokenizer, distinct, index.message_prefix, batch_size=128,
                                   progress=progress)
        row = {text: i for i, text in enumerate(distinct)}
        return vectors[[row[t] for t in whole]], vectors[[row[t] for t in alone]]

    def without_own_documents(self, questions: list[str], scores, vectors: np.ndarray | None = None):
        """`scores` (batch, pairs) of training `questions`, with the pretrained encoder's cosine to each one's own
        answer document taken as if the question were not in that document (leave-one-out for the document
        lever: a document that holds the question's own words finds it far more surely than a new wording
        would). `vectors`: the questions' own (`bulk_vectors`), if the caller has them. Calibration needs this;
        without the pretrained lever `scores` is returned as it is."""
        if not self.config.pretrained:
            return scores
        positions, documents, messages, without = self.own_vectors(questions, vectors)
        if not positions:
            return scores
        index = self.pretrained
        messages, without = index.project(messages).numpy(), index.project(without).numpy()
        change = np.sum(messages * (without - index.projected.numpy()[documents]), axis=1)
        change *= self.config.pretrained / self.config.total
        scores = np.array(scores)
        document_of = self.document_of.numpy()[:self.own_rows]
        for i, document, delta in zip(positions, documents, change):
            scores[i, :self.own_rows][document_of == document] += delta
        return tf.constant(scores)

    def fit_projection(self) -> np.ndarray | None:
        """Learn the pretrained index's projection from the training questions (`fit_projection`), set it and
        return it: each question toward its answer's document written without it, away from every other answer's.
        None (and the identity kept) beyond PROJECTION_MOST documents, where every answer as a negative would not
        fit in memory."""
        documents = self.pretrained.embeddings.numpy()
        questions = list(dict.fromkeys(p.question for p in self.pairs))
        if len(documents) > PROJECTION_MOST or len(questions) < MIN_CALIBRATION:
            return None
        _, targets, messages, without = self.own_vectors(questions)
        projection = fit_projection(messages, without, documents, targets)
        self.pretrained.set_projection(projection)
        return projection

    def confident(self, texts, similarity=None):
        """Whether some training question is close enough to each message (batch,) bool: its best score reaches
        the calibrated threshold (always, with threshold 0)."""
        similarity = self.similarity(texts) if similarity is None else similarity
        return tf.reduce_max(similarity, axis=1) >= self.config.threshold

    def nearest(self, texts, k: int, tones=None, leave_one_out: bool = False, similarity=None):
        """The answers of the `k` nearest training questions, nearest first: strings (batch, k).

        `tones` (batch,) int: rows labelled with a question's tone get TONE_BONUS (NO_TONE: none).
        `leave_one_out`: a training question never finds a row with its own text (for training).
        `similarity`: the questions' `similarity`, if the caller has it already."""
        return self.ranked(texts, k, tones, leave_one_out, similarity=similarity)[0]

    def neighbours(self, texts, k: int, tones=None, leave_one_out: bool = False, similarity=None):
        """`nearest`, with the question each answer was given to: questions and answers, strings (batch, k')."""
        top, _ = self.top_rows(texts, k, tones, leave_one_out, similarity=similarity)
        return tf.gather(self.questions, top), tf.gather(self.answers, top)

    def ranked(self, texts, k: int, tones=None, leave_one_out: bool = False, only_tone: bool = False,
               similarity=None):
        """`nearest`, with each answer's question's similarity score (without the tone's bonus): answers
        (batch, k') strings and scores (batch, k') float32, k' = min(k, pairs). `only_tone`: rows of the
        asked tone come first, however far, instead of getting TONE_BONUS."""
        top, similarity = self.top_rows(texts, k, tones, leave_one_out, only_tone, similarity)
        return tf.gather(self.answers, top), tf.gather(similarity, top, batch_dims=1)

    def top_rows(self, texts, k: int, tones=None, leave_one_out: bool = False, only_tone: bool = False,
                 similarity=None):
        """The rows `ranked` ranks first (batch, k') int32, and the questions' similarity to every row."""
        texts = tf.convert_to_tensor(texts, tf.string)
        similarity = scores = self.similarity(texts) if similarity is None else similarity
        if tones is not None:
            tones = tf.convert_to_tensor(tones, tf.int32)
            asked = tones[:, None] != NO_TONE
            same = (self.labels[None] == tones[:, None]) & asked
            if only_tone:
                scores = tf.where(asked & ~same, similarity - OTHER_TONE_PENALTY, similarity)
            else:
                scores = similarity + TONE_BONUS * tf.cast(same, scores.dtype)
        if leave_one_out:
            scores = self.without_own_rows(texts, scores)
        return tf.math.top_k(scores, k=min(k, len(self.pairs))).indices, similarity

    def batch_size(self, most: int = 256) -> int:
        """How many messages a bulk lookup scores at once: at most `most`, and at most SCORE_CELLS cells of
        (message, row), so its memory does not grow with the rows times the batch."""
        return max(1, min(most, SCORE_CELLS // len(self.pairs)))

    def leave_one_out(self, pairs: list[QAPair], k: int, tones, batch_size: int = 256,
                      progress=None) -> list[list[QAPair]]:
        """`neighbours` for many training questions, in batches of at most `batch_size` (`Retriever.batch_size`),
        none with the question's own text: (len(pairs), k') pairs, nearest first. Each distinct question is
        scored once (the schedule repeats a small set's pairs many times an epoch), and each of its tones looked
        up by one traced function. With the pretrained lever the questions are embedded first, each text once and
        sorted by length (`bulk_vectors`), and a question is also read against its own answer's document written
        without it (`without_own_documents`): else the document that holds its words puts its own answer first
        for nearly every training question, and the model learns to copy whatever it is shown. `progress`: called
        with (a stage's name, done, of) as embedding and then the lookups go on."""
        batch_size = self.batch_size(batch_size)
        keys = list(zip((p.question for p in pairs), map(int, tones)))
        tones_of: dict[str, list[int]] = {}
        for question, tone in dict.fromkeys(keys):
            tones_of.setdefault(question, []).append(tone)
        questions = sorted(tones_of, key=len)  # a batch of one length pads little
        lookup = tf.function(lambda t, s, m: self.top_rows(t, k, s, leave_one_out=True, similarity=m)[0],
                             autograph=False, input_signature=[tf.TensorSpec([None], tf.string),
                                                               tf.TensorSpec([None], tf.int32),
                                                               tf.TensorSpec([None, len(self.pairs)], tf.float32)])
        strings = tf.TensorSpec([None], tf.string)
        if self.config.pretrained:
            whole, alone = self.bulk_vectors(
                questions, None if progress is None else lambda done, of: progress("embedding", done, of))
            vector = tf.TensorSpec([None, self.pretrained.encoder.hidden], tf.float32)
            similarity = tf.function(lambda t, w, a: self.similarity(t, (w, a)), autograph=False,
                                     input_signature=[strings, vector, vector])
        else:
            similarity = tf.function(self.similarity, autograph=False, input_signature=[strings])
        found = {}
        for first in range(0, len(questions), batch_size):
            chunk = questions[first:first + batch_size]
            if self.config.pretrained:
                rows = slice(first, first + batch_size)
                scores = self.without_own_documents(chunk, similarity(tf.constant(chunk), whole[rows], alone[rows]),
                                                    whole[rows])
            else:
                scores = similarity(tf.constant(chunk))
            asked = [(i, question, tone) for i, question in enumerate(chunk) for tone in tones_of[question]]
            where, texts, chunk_tones = zip(*asked)
            rows = lookup(tf.constant(texts), tf.constant(chunk_tones, tf.int32), tf.gather(scores, list(where)))
            found.update(zip(((q, t) for _, q, t in asked), ([self.pairs[i] for i in row] for row in rows.numpy())))
            if progress is not None:
                progress("looking up", first + len(chunk), len(questions))
        return [list(found[key]) for key in keys]

    def to_json(self) -> bytes:
        return index_json(self.pairs[:self.own_rows], self.small_talk, self.hands_on)

    @classmethod
    def from_json(cls, data: bytes, config: RetrievalConfig = CHARACTERS_ONLY, encoder=None, tokenizer=None,
                  embeddings: np.ndarray | None = None, pretrained=None,
                  pretrained_embeddings: np.ndarray | None = None, projection: np.ndarray | None = None
                  ) -> "Retriever":
        return cls(pairs_of(data), config, encoder, tokenizer, embeddings, pretrained, pretrained_embeddings,
                   small_talk_of(data), projection, small_talk_of(data, "hands_on"))


    @classmethod
    def load(cls, path: str | Path) -> "Retriever":
        return cls.from_json(Path(path).read_bytes())


def pairs_of(data: bytes) -> list[QAPair]:
    """The pairs of a retrieval index's JSON (`index_json`)."""
    return [QAPair(q, a, label) for q, a, label in json.loads(data.decode("utf-8"))["pairs"]]


def small_talk_of(data: bytes, key: str = "small_talk") -> list[QAPair]:
    """The small talk of a retrieval index's JSON (`index_json`): what it finds under its stricter bar, or with
    `key` "hands_on", what a model built on it keeps."""
    return [QAPair(q, a, label) for q, a, label in json.loads(data.decode("utf-8")).get(key, [])]


def index_rows(pairs: list[QAPair], small_talk: list[QAPair] = ()) -> tuple[tuple, tuple]:
    """An index's own rows and its small talk's, in `Retriever`'s order: each pair once, small talk that is also
    an own pair only as that."""
    own = tuple(dict.fromkeys(pairs))
    return own, tuple(p for p in dict.fromkeys(small_talk) if p not in set(own))


def document_embeddings(pairs: list[QAPair], small_talk: list[QAPair], known: Retriever) -> np.ndarray:
    """The pretrained encoder's embeddings of the answer documents of an index of `pairs` and `small_talk`, in
    `Retriever`'s order, taking each document `known` (a retriever over some of these pairs: training's) holds
    from it and embedding only the rest (a model directory's index adds the held-out pairs to training's)."""
    from chatbot.model.pretrained import embed as pretrained_embed

    documents, _ = answer_documents(tuple(dict.fromkeys(sum(index_rows(pairs, small_talk), ()))))
    had = dict(zip(answer_documents(known.pairs)[0], known.pretrained.embeddings.numpy()))
    missing = [d for d in documents if d not in had]
    index = known.pretrained
    had.update(zip(missing, pretrained_embed(index.encoder, index.tokenizer, missing, PRETRAINED_PREFIXES[1])))
    return np.stack([had[d] for d in documents]) if documents else np.zeros((0, index.encoder.hidden), np.float32)


def saved_embeddings(pairs: list[QAPair], encoder, tokenizer) -> np.ndarray:
    """The sentence embeddings of an index's questions, in its order, as a model directory keeps them (float16:
    half the bytes, cosines within 1e-3), so that loading it need not embed them again."""
    questions = [p.question for p in dict.fromkeys(pairs)]
    return embed(encoder, tokenizer.encode(questions)).astype(np.float16)


def answer_documents(pairs) -> tuple[list[str], np.ndarray]:
    """One document per distinct answer: the answer after every question it was given to. A message that shares
    words with any phrasing of a question, or with the answer itself, finds it ("sparse-to-answer"). Returns the
    documents and each pair's document (int64, per pair)."""
    questions: dict[str, list[str]] = {}
    for pair in pairs:
        questions.setdefault(pair.answer, []).append(one_text(pair.question))
    where = {answer: i for i, answer in enumerate(questions)}
    documents = [" ".join([*asked, answer]) for answer, asked in questions.items()]
    return documents, np.array([where[p.answer] for p in pairs], np.int64)


def index_json(pairs: list[QAPair], small_talk: list[QAPair] = (), hands_on: list[QAPair] = ()) -> bytes:
    """The contents of a model directory's retrieval index, as JSON: the pairs, the small talk (greetings,
    thanks, goodbyes, questions about the bot) it keeps from its base under a stricter bar, and the small talk
    it hands on to a model built on it."""
    index = {"pairs": [[p.question, p.answer, p.label] for p in dict.fromkeys(pairs)]}
    for key, rows in (("small_talk", small_talk), ("hands_on", hands_on)):
        if rows:
            index[key] = [[p.question, p.answer, p.label] for p in dict.fromkeys(rows)]
    return json.dumps(index, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def index_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


MIN_CALIBRATION = 10  # in-scope questions needed to calibrate at all (fewer: no fallback)
# The projection a model built for its own Q&A learns (bench/faq_levers.py, on the example FAQs: the library's
# paraphrases answered right 58% -> 72%): InfoNCE at this temperature against every answer's document, Adam at this
# rate for this many full-batch steps, and this weight pulling it toward the identity. Every answer is a negative,
# so an index of more than PROJECTION_MOST documents keeps the identity.
PROJECTION_STEPS, PROJECTION_RATE, PROJECTION_PULL, PROJECTION_TEMPERATURE = 300, 1e-3, 0.01, 0.05
PROJECTION_MOST = 3000
CALIBRATION_FOLDS = 5


def fit_projection(messages: np.ndarray, own: np.ndarray, documents: np.ndarray, targets: np.ndarray,
                   steps: int = PROJECTION_STEPS) -> np.ndarray:
    """A (hidden, hidden) projection W, the identity plus what it learns: each message's unit vector times W
    (l2-normalised) scored against every document's times W, its own document `targets[i]` replaced by `own[i]`
    (that document written without the message), trained with cross-entropy toward its own (InfoNCE) and
    PROJECTION_PULL * ||W - I||^2. Deterministic: it starts at the identity and takes full batches."""
    eye = tf.eye(messages.shape[1])
    change = tf.Variable(tf.zeros_like(eye))
    optimizer = tf.keras.optimizers.Adam(PROJECTION_RATE)
    messages, own, documents = (tf.constant(x, tf.float32) for x in (messages, own, documents))
    is_own = tf.one_hot(tf.constant(targets, tf.int32), documents.shape[0]) > 0

    @tf.function(autograph=False)
    def step():
        with tf.GradientTape() as tape:
            projection = eye + change
            asked = tf.math.l2_normalize(messages @ projection, axis=1)
            kept = tf.math.l2_normalize(own @ projection, axis=1)
            every = tf.math.l2_normalize(documents @ projection, axis=1)
            logits = tf.where(is_own, tf.reduce_sum(asked * kept, axis=1, keepdims=True),
                              tf.matmul(asked, every, transpose_b=True))
            loss = tf.reduce_mean(tf.nn.softmax_cross_entropy_with_logits(tf.cast(is_own, tf.float32),
                                                                          logits / PROJECTION_TEMPERATURE))
            loss += PROJECTION_PULL * tf.reduce_sum(tf.square(change))
        optimizer.apply_gradients([(tape.gradient(loss, change), change)])

    for _ in range(steps):
        step()
    return (eye + change).numpy()


def cross_fitted_threshold(retriever: "Retriever", questions: list[str], share: float) -> float:
    """`calibrated_threshold` for an index whose projection was learned from its own questions, which it pulls
    close to their documents: in CALIBRATION_FOLDS folds, a projection learned without a fold's questions scores
    them against every document (their own written without them), and the `share` quantile of the best scores
    is the threshold (bench/faq_levers.py: calibrated on the projected scores themselves, 70-95% of the FAQs'
    paraphrases fell back)."""
    index = retriever.pretrained
    documents = index.embeddings.numpy()
    _, targets, messages, without = retriever.own_vectors(questions)
    own_documents = np.unique(retriever.document_of.numpy()[:retriever.own_rows])
    folds = np.arange(len(targets)) % CALIBRATION_FOLDS
    best = []
    for fold in range(CALIBRATION_FOLDS):
        held, kept = folds == fold, folds != fold
        if not held.any() or not kept.any():
            continue
        projection = tf.constant(fit_projection(messages[kept], without[kept], documents, targets[kept]))

        def project(x):
            return tf.math.l2_normalize(tf.constant(x, tf.float32) @ projection, axis=1).numpy()

        asked, own, every = project(messages[held]), project(without[held]), project(documents[own_documents])
        scores = asked @ every.T
        scores[own_documents[None, :] == targets[held][:, None]] = -1.0
        best.append(np.maximum(scores.max(axis=1), np.sum(asked * own, axis=1)))
    return float(np.quantile(np.concatenate(best), share)) if best else 0.0


def calibrated_threshold(retriever: Retriever, train_pairs: list[QAPair], val_pairs: list[QAPair],
                         share: float = 0.05, batch_size: int = 256) -> float:
    """The score below which a message gets the fallback reply: the `share` quantile of in-scope questions'
    best scores. In-scope questions are the held-out ones (`val_pairs`, retrieving from the training pairs), or
    without any, each training question whose answer has other questions, retrieving with its own text left
    out (so its nearest row is a paraphrase, as a new wording would find). 0 (never) when fewer than
    MIN_CALIBRATION such questions exist."""
    if val_pairs:
        questions, leave_out = [p.question for p in val_pairs], False
    else:
        asked: dict[str, set[str]] = {}
        for pair in train_pairs:
            asked.setdefault(pair.answer, set()).add(pair.question)
        questions = list(dict.fromkeys(p.question for p in train_pairs if len(asked[p.answer]) > 1))
        leave_out = True
    if len(questions) < MIN_CALIBRATION or not share:
        return 0.0
    if leave_out and retriever.config.pretrained and retriever.config.pretrained == retriever.config.total \
            and not np.allclose(retriever.pretrained.projection.numpy(), np.eye(retriever.pretrained.encoder.hidden)):
        return cross_fitted_threshold(retriever, questions, share)
    batch_size = retriever.batch_size(batch_size)
    best = []
    for first in range(0, len(questions), batch_size):
        texts = tf.constant(questions[first:first + batch_size])
        scores = retriever.similarity(texts)
        if leave_out:
            scores = retriever.without_own_rows(texts, scores)
            scores = retriever.without_own_documents(questions[first:first + batch_size], scores)
        best.append(tf.reduce_max(scores, axis=1).numpy())
    return float(np.quantile(np.concatenate(best), share))


# A share of small talk's own phrasings (each of its questions with its own row left out, though its answer's document
# still holds its words, so these scores run high) allowed under its bar. On the example FAQs (bench/small_csv.py) 0.1 let half of the everyday messages of bench/probes.txt answer with a
# greeting; 0.3 lets 12-18% of them, and 7-8 in 10 greetings, thanks and goodbyes worded anew; no out-of-scope
# question gets small talk at either.
SMALL_TALK_SHARE = 0.3


def small_talk_bar(retriever: Retriever, threshold: float, share: float = SMALL_TALK_SHARE) -> float:
    """The score a message must reach to get an answer of the small talk a model keeps from its base: the `share`
    quantile of each small-talk question's best score over the small talk, its own row left out (its document is
    kept whole: small talk is not among the rows whose documents `without_own_documents` rewrites), and at least
    `threshold`. Retrieval by the pretrained encoder only (its scores are comparable across texts); else,
    or with too little small talk to calibrate on, `threshold`."""
    strict = list(retriever.pairs[retriever.own_rows:])
    if len(strict) < MIN_CALIBRATION or not retriever.config.pretrained:
        return threshold
    questions = list(dict.fromkeys(p.question for p in strict))
    texts = tf.constant(questions)
    scores = retriever.similarity(texts)  # a retriever being trained: its bar is still 0, so nothing is hidden
    best = np.max(retriever.without_own_rows(texts, scores).numpy()[:, retriever.own_rows:], axis=1)
    return max(threshold, float(np.quantile(best, share)))

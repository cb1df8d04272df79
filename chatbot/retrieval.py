"""Nearest-question retrieval, inside the graph: the training answers a reply can build on.

Owns: the retrieval index of a model directory (`retrieval.json`: the training pairs), TF-IDF over
character bigrams of the training questions with cosine similarity (smooth idf, l2-normalised rows,
as scikit-learn's TfidfVectorizer) kept as an inverted index (each bigram's questions), the in-graph
lookup that decoding and the SavedModel run, a preference for answers of the asked tone, and
leave-one-out lookups for training (a question never finds itself, nor any row with the same
question). Must not know about token ids or the model.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import tensorflow as tf

from chatbot.data import QAPair
from chatbot.tokenizer import normalize_tf

# Added to the cosine similarity of rows whose label is the asked tone: among questions about as
# close, the answer in the asked tone wins; a much closer question of another tone still does.
TONE_BONUS = 0.15
# `ranked(..., only_tone=True)` puts every row of the asked tone before every other row by taking
# this from the others' scores (cosines, at most 1).
OTHER_TONE_PENALTY = 10.0
NO_TONE = -1


def char_bigrams(text: str) -> list[str]:
    """The graph's `tf.strings.ngrams` over characters: a one-character text has none."""
    return [text[i:i + 2] for i in range(len(text) - 1)]


class Retriever(tf.Module):
    """The answers of the training questions nearest a question. Everything it holds is a variable or
    a lookup table, so it travels inside a SavedModel."""

    def __init__(self, pairs: list[QAPair]):
        super().__init__(name="retriever")
        if not pairs:
            raise ValueError("a retrieval index needs at least one training pair")
        self.pairs = list(dict.fromkeys(pairs))  # a repeated row would only crowd out other candidates
        documents = [Counter(char_bigrams(p.question)) for p in self.pairs]
        vocabulary = {gram: i for i, gram in enumerate(sorted({g for doc in documents for g in doc}))}
        frequency = Counter(gram for doc in documents for gram in doc)
        idf = np.ones(max(len(vocabulary), 1), np.float32)
        for gram, i in vocabulary.items():
            idf[i] = math.log((1 + len(documents)) / (1 + frequency[gram])) + 1
        postings = [[] for _ in idf]  # an inverted index: for each bigram, (row, weight) of the questions with it
        for row, doc in enumerate(documents):
            weights = {vocabulary[g]: count * idf[vocabulary[g]] for g, count in doc.items()}
            norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
            for column, weight in weights.items():
                postings[column].append((row, weight / norm))
        keys = sorted(vocabulary) or [""]
        self.table = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(tf.constant(keys), tf.constant([vocabulary.get(k, 0) for k in keys],
                                                                               tf.int64)), default_value=-1)
        self.vocabulary_size = len(idf)
        self.idf = tf.Variable(idf, trainable=False, name="idf")
        self.posting_starts = tf.Variable(np.cumsum([0] + [len(p) for p in postings]), dtype=tf.int64, trainable=False,
                                          name="posting_starts")  # bigram i's postings: [starts[i], starts[i + 1])
        self.posting_rows = tf.Variable(np.array([row for p in postings for row, _ in p], np.int64).reshape(-1),
                                        trainable=False, name="posting_rows")
        self.posting_weights = tf.Variable(np.array([w for p in postings for _, w in p], np.float32).reshape(-1),
                                           trainable=False, name="posting_weights")
        self.questions = tf.Variable([p.question for p in self.pairs], trainable=False, name="questions")
        self.answers = tf.Variable([p.answer for p in self.pairs], trainable=False, name="answers")
        self.labels = tf.Variable([NO_TONE if p.label is None else p.label for p in self.pairs], dtype=tf.int32,
                                  trainable=False, name="labels")

    def __len__(self) -> int:
        return len(self.pairs)

    def similarity(self, texts):
        """Questions (batch,) -> cosine similarity to every training question (batch, pairs), in [0, 1]
        (0 for a question with no known bigram)."""
        texts = normalize_tf(texts)
        grams = tf.strings.ngrams(tf.strings.unicode_split(texts, "UTF-8"), 2, separator="")
        ids = self.table.lookup(grams)
        known = ids.flat_values >= 0
        rows = tf.boolean_mask(ids.value_rowids(), known)
        columns = tf.boolean_mask(ids.flat_values, known)
        batch, size = tf.shape(texts, out_type=tf.int64)[0], tf.constant(self.vocabulary_size, tf.int64)
        # The query's weights: each bigram once per question, its idf times its count, l2-normalised.
        entries, entry_of = tf.unique(rows * size + columns)
        entry_rows, entry_columns = entries // size, entries % size
        weights = tf.math.unsorted_segment_sum(tf.gather(self.idf, columns), entry_of, tf.size(entries))
        squares = tf.math.unsorted_segment_sum(tf.square(weights), entry_rows, batch)
        weights *= tf.gather(tf.math.rsqrt(tf.maximum(squares, 1e-12)), entry_rows)  # as tf.math.l2_normalize
        # Cosine: summed over the bigrams a training question shares with the query, read from the postings of
        # the query's bigrams only (a few thousand entries instead of every question's bigrams).
        starts, ends = tf.gather(self.posting_starts, entry_columns), tf.gather(self.posting_starts, entry_columns + 1)
        hits = tf.ragged.range(starts, ends)  # (entries, None): positions in the postings
        shared = tf.gather(self.posting_weights, hits.flat_values) * tf.repeat(weights, hits.row_lengths())
        targets = tf.repeat(entry_rows, hits.row_lengths()) * len(self.pairs) + tf.gather(self.posting_rows,
                                                                                          hits.flat_values)
        scores = tf.math.unsorted_segment_sum(shared, targets, batch * len(self.pairs))
        return tf.reshape(scores, tf.stack([batch, len(self.pairs)]))

    def nearest(self, texts, k: int, tones=None, leave_one_out: bool = False, similarity=None):
        """The answers of the `k` nearest training questions, nearest first: strings (batch, k).

        `tones` (batch,) int: rows labelled with a question's tone get TONE_BONUS (NO_TONE: none).
        `leave_one_out`: a training question never finds a row with its own text (for training).
        `similarity`: the questions' `similarity`, if the caller has it already."""
        return self.ranked(texts, k, tones, leave_one_out, similarity=similarity)[0]

    def ranked(self, texts, k: int, tones=None, leave_one_out: bool = False, only_tone: bool = False,
               similarity=None):
        """`nearest`, with each answer's question's similarity score (without the tone's bonus): answers
        (batch, k') strings and scores (batch, k') float32, k' = min(k, pairs). `only_tone`: rows of the
        asked tone come first, however far, instead of getting TONE_BONUS."""
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
            scores = tf.where(self.questions[None] == normalize_tf(texts)[:, None], -1e9, scores)
        top = tf.math.top_k(scores, k=min(k, len(self.pairs))).indices
        return tf.gather(self.answers, top), tf.gather(similarity, top, batch_dims=1)

    def leave_one_out(self, pairs: list[QAPair], k: int, tones, batch_size: int = 256) -> list[list[str]]:
        """`nearest` for many training questions, in batches: candidates (len(pairs), k) as text."""
        lookup = tf.function(lambda t, s: self.nearest(t, k, s, leave_one_out=True), autograph=False)
        found = []
        for first in range(0, len(pairs), batch_size):
            chunk = [p.question for p in pairs[first:first + batch_size]]
            answers = lookup(tf.constant(chunk), tf.constant(tones[first:first + batch_size], tf.int32))
            found += [[a.decode("utf-8") for a in row] for row in answers.numpy()]
        return found

    def to_json(self) -> bytes:
        return index_json(self.pairs)

    @classmethod
    def from_json(cls, data: bytes) -> "Retriever":
        return cls([QAPair(q, a, label) for q, a, label in json.loads(data.decode("utf-8"))["pairs"]])

    @classmethod
    def load(cls, path: str | Path) -> "Retriever":
        return cls.from_json(Path(path).read_bytes())


def index_json(pairs: list[QAPair]) -> bytes:
    """The contents of a model directory's retrieval index: the pairs, as JSON."""
    rows = [[p.question, p.answer, p.label] for p in dict.fromkeys(pairs)]
    return json.dumps({"pairs": rows}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def index_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

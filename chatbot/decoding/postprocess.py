"""Postprocess: reply ids as a user reads them, in the same graph as the loop.

Owns: `tidy` (a stutter of whole words said once; a phrase said twice in a row, or a runaway loop, cut:
`repeat_cut`), `trim`, and `Finisher`: the tidied ids, the fallback where no training question is close enough,
detokenizing, and the crisis reply (`chatbot.safety.keywords`'s list and, with e5 loaded and asked for,
`chatbot.safety.meaning`'s classifier) for every plan's reply graph; the stream runs the same functions on each
growing prefix. Must not decode.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chatbot.safety.keywords import crisis_replies
from chatbot.safety.meaning import REPLIES as CLASS_REPLIES
from chatbot.data.text_tf import normalize_tf, question_part_tf
from chatbot.tokenizer.subword import END_ID, PAD_ID, Tokenizer

REPEATED_PHRASE = 3  # tokens: a phrase at least this long said twice in a row is said once ("이유가 있지 않을까요." x2)
RUNAWAY_PERIOD = 8  # tokens: a shorter block repeated to the length limit ("있어요 있어요 있어요 ...") is cut too
STUTTER = 3  # copies: a block shorter than a phrase said this many times in a row is said once ("수고 수고 수고")


def tidy(ids: tf.Tensor, word_starts: tf.Tensor) -> tf.Tensor:
    """Reply ids (batch, max_length), padded after the end token, as a user reads them: a stutter said once
    (`stutter_kept`: "수고 수고 수고 많았어요!" -> "수고 많았어요!", the rest of the reply kept; `word_starts`: which
    pieces begin a word, (vocabulary,) bool, `Tokenizer.word_starts`), then the reply cut
    where `repeat_cut` cuts it; padding after what is kept. One graph function for every entry point: the reply
    graph runs it before the fallback (`Finisher`: `reply`, `reply_batch`, the naive oracle, the SavedModel), and
    `stream` on each growing prefix (`Finisher.prefix_text`), so what it shows grows into what `reply` gives."""
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


class Finisher:
    """`finish(texts, ids, confident)`: the reply graph's last stage for one model. `word_starts`: which pieces begin
    a word (`Tokenizer.word_starts`); `retriever`: its index (None: no fallback); `crisis_classes`: messages
    (batch,), normalised -> crisis classes (batch,) by meaning (`chatbot.safety.meaning`), or None: the list alone."""

    def __init__(self, tokenizer: Tokenizer | None, retriever, word_starts, crisis_classes=None):
        self.tokenizer, self.retriever, self.word_starts = tokenizer, retriever, word_starts
        self.crisis_classes = crisis_classes

    def __call__(self, texts, ids, confident):
        """Reply ids (batch, max_length) and strings (batch,): each reply tidied (`tidy`), where a question has no
        training question close enough (`confident` 0) the fallback reply (and no ids: nothing of the model's own
        reply is kept), and where its new message may signal a crisis the crisis reply (`crisis`)."""
        unsure = confident < 0.5
        ids = tf.where(unsure[:, None], PAD_ID, tidy(ids, self.word_starts))
        strings = self.tokenizer.detokenize(ids)
        if self.retriever is not None:
            strings = tf.where(unsure, self.retriever.config.fallback, strings)
        return ids, self.crisis(texts, strings)

    def crisis(self, texts, replies):
        """Each text's reply (batch,), or the crisis reply where its new message may signal self-harm, suicide or
        abuse: the classifier by meaning where asked for, then the list (`crisis_replies`), which wins."""
        messages = question_part_tf(tf.convert_to_tensor(texts, tf.string))
        if self.crisis_classes is not None:
            classes = self.crisis_classes(normalize_tf(messages))
            for kind, reply in CLASS_REPLIES.items():
                replies = tf.where(classes == kind, reply, replies)
        return crisis_replies(messages, replies)

    def prefix_text(self, ids):
        """A growing reply's ids (batch, length), padded, as `__call__` would show them: the text of what `tidy`
        keeps, less a last character whose bytes have not all arrived (a byte piece, "<0xED>", of a character the
        vocabulary lacks), and whether `tidy` cut the prefix (batch,) bool (the stream then ends there)."""
        ids, cut = tidy_parts(ids, self.word_starts)
        kept = tf.where(tf.range(tf.shape(ids)[1])[None] < cut[:, None], ids, PAD_ID)
        text = tf.strings.regex_replace(self.tokenizer.detokenize(kept), "\ufffd+$", "")
        return text, cut < _ended_at(ids)

"""tf.data input pipeline: token ids -> length-grouped teacher-forcing batches.

Owns: the encoder input's layout, composed in one place for training and decoding alike
(`compose_encoder_inputs`, through `encoder_inputs`), start/end tokens, the length filter and truncation, grouping rows by length, shuffle, cache,
prefetch and the teacher-forcing shift. Every step is a TensorFlow op (no Python per element).
Batches are `((encoder_inputs, decoder_inputs), targets)`, padded with 0.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chatbot.text import TURN
from chatbot.tokenizer import END_ID, NUM_SPECIAL, SEPARATOR_ID, START_ID, TONE_IDS

# Widths a batch side is padded up to (its longest row's length, rounded up to one of these), so a
# compiled train step sees a bounded set of shapes.
PAD_WIDTHS = (5, 7, 9, 11, 13, 15, 19, 23, 27, 31, 35, 39, 47, 55, 63, 79, 95, 111, 127)
# Batches are made from windows of this many batches' rows sorted by length (the "sortish" batching of
# fairseq and Hugging Face's group_by_length): each batch holds rows of about the same lengths on both
# sides, and the batches of a window are shuffled again.
SORT_WINDOW = 64


def add_start_end(ids: tf.RaggedTensor) -> tf.RaggedTensor:
    batch = ids.nrows()
    start = tf.fill([batch, 1], tf.constant(START_ID, ids.dtype))
    end = tf.fill([batch, 1], tf.constant(END_ID, ids.dtype))
    return tf.concat([start, ids, end], axis=1)


def in_window(ids: tf.RaggedTensor, first, last) -> tf.RaggedTensor:
    """Each row's items at positions [first, last) (ints or (batch,) tensors; Python slicing's rules are not
    available for ragged inner dimensions)."""
    positions = tf.ragged.range(ids.row_lengths())
    first = tf.cast(first, positions.dtype)[..., None] if tf.is_tensor(first) else first
    last = tf.cast(last, positions.dtype)[..., None] if tf.is_tensor(last) else last
    return tf.ragged.boolean_mask(ids, (positions >= first) & (positions < last))


def split_turns(tokenize, texts, turns: int):
    """Strings (batch,) that may hold a conversation (`chatbot.text.TURN` between the new message and the
    messages before it, newest first) -> the new messages' ids (batch, None) and, with `turns`, the ids of up to
    `turns` earlier messages (batch, None, None); None when the model reads no context."""
    if not turns:
        return tokenize(texts), None
    parts = tf.strings.split(texts, TURN)
    earlier = in_window(parts, 1, turns + 1)
    return (tokenize(parts.to_tensor("")[:, 0]),
            tf.RaggedTensor.from_row_lengths(tokenize(earlier.flat_values), earlier.row_lengths()))


def encoder_inputs(question_ids: tf.RaggedTensor, max_length: int, tones=None, context_ids=None,
                   encoder_length: int | None = None, context_question_ids=None, turn_ids=None) -> tf.RaggedTensor:
    """`[start] tone question [end]`, then for each earlier message of `turn_ids` (batch, turns, None), newest
    first, `[start] its last max_length // 2 tokens [end]`, then for each retrieved pair `<sep> [start] its
    question [end] answer` (or `<sep> answer` without `context_question_ids`), cut to `encoder_length`.
    The question keeps the first positions whatever came before it, as for a first message; the copy head
    copies only after the first separator, so never from the conversation.

    The question is cut to `max_length` tokens with its end token kept; `tones` (batch,) int holds
    0/1/2 or -1 for no tone token; `context_ids` (batch, k, None) holds the retrieved answers' ids,
    each cut to `max_length - 1` so that its separator fits in `max_length`, and `context_question_ids`
    (batch, k, None) the questions they answered, cut as the asked question is. Seeing a neighbour's
    question lets the encoder judge whether its answer fits the question asked."""
    body = question_ids[:, : max_length - 2]
    if tones is not None:
        tones = tf.convert_to_tensor(tones, question_ids.dtype)
        token = tf.gather(tf.constant(TONE_IDS, question_ids.dtype), tf.maximum(tones, 0))
        tone = tf.ragged.boolean_mask(token[:, None], (tones >= 0)[:, None])
        body = tf.concat([tone, body], axis=1)
    ids = add_start_end(body)
    if turn_ids is not None:
        earlier = turn_ids.merge_dims(0, 1)  # (batch * turns, None)
        lengths = earlier.row_lengths()
        earlier = add_start_end(in_window(earlier, lengths - max_length // 2, lengths))
        ids = tf.concat([ids, tf.RaggedTensor.from_row_lengths(earlier, turn_ids.row_lengths()).merge_dims(1, 2)],
                        axis=1)
    if context_ids is not None:
        answers = context_ids.merge_dims(0, 1)[:, : max_length - 1]  # (batch * k, None)
        separator = tf.fill([answers.nrows(), 1], tf.constant(SEPARATOR_ID, ids.dtype))
        if context_question_ids is not None:
            asked = add_start_end(context_question_ids.merge_dims(0, 1)[:, : max_length - 2])
            separated = tf.concat([separator, asked, answers], axis=1)
        else:
            separated = tf.concat([separator, answers], axis=1)
        regrouped = tf.RaggedTensor.from_row_lengths(separated, context_ids.row_lengths())  # (batch, k, None)
        ids = tf.concat([ids, regrouped.merge_dims(1, 2)], axis=1)
    return ids[:, : encoder_length or max_length]


def compose_encoder_inputs(tokenize, texts, tones, config, answers=None, asked=None) -> tf.RaggedTensor:
    """The encoder input of strings (batch,), as training and decoding both compose it: each text split into its
    new message and the messages before it (`split_turns`, for a model that reads `config.context.turns`), its
    tone (batch,) int if the model learned tones, and the retrieved neighbours' `answers` and `asked` questions
    (batch, k) strings, when the model reads them (`config.context.retrieved`, `questions`), through
    `encoder_inputs`. `config`: the model's `ChatbotConfig`."""
    context, model = config.context, config.model
    question, turns = split_turns(tokenize, texts, context.turns)
    answer_ids = question_ids = None
    if context.retrieved:
        answers = tf.convert_to_tensor(answers, tf.string)
        width = tf.shape(answers, out_type=tf.int64)[1]  # (batch, k)
        answer_ids = tf.RaggedTensor.from_uniform_row_length(tokenize(tf.reshape(answers, [-1])), width)
        if context.questions:
            question_ids = tf.RaggedTensor.from_uniform_row_length(
                tokenize(tf.reshape(tf.convert_to_tensor(asked, tf.string), [-1])), width)
    return encoder_inputs(question, model.max_length, tones if context.tone else None, answer_ids,
                          model.encoder_length, question_ids, turns)


def bucket(size, buckets):
    """The smallest of `buckets` (ascending) that holds `size`, in the graph; a larger size stays as it is."""
    buckets = tf.constant(buckets)
    return tf.maximum(tf.reduce_min(tf.where(buckets >= size, buckets, buckets[-1])), size)


def fits(answer_ids: tf.RaggedTensor, max_length: int) -> np.ndarray:
    """Which answers fit in a decoder sequence of `max_length` (+ start/end, minus the shift)."""
    return (answer_ids.row_lengths() + 1 <= max_length).numpy()


def _even_rows(batch, replicas: int):
    """The first rows of every tensor in `batch`, as many as divide evenly among `replicas`."""
    rows = tf.shape(batch[1])[0]
    return tf.nest.map_structure(lambda t: t[: rows - rows % replicas], batch)


def make_dataset(question_ids: tf.RaggedTensor, answer_ids: tf.RaggedTensor, *, max_length: int,
                 batch_size: int, shuffle: bool = True, seed: int = 42, bucketed: bool = True,
                 encoder_ids: tf.RaggedTensor | None = None, replicas: int = 1) -> tf.data.Dataset:
    """Batches for `Transformer.fit`. Answers too long to end inside `max_length` are dropped
    (a truncated answer would teach the model replies that never end); questions are truncated.
    `encoder_ids`, if given, are the composed encoder inputs (see `encoder_inputs`) and replace
    `[start] question [end]`. With `replicas` > 1, each batch keeps a multiple of `replicas` rows.

    Batches are grouped by length: windows of `SORT_WINDOW` batches' rows are sorted by the width
    their answer pads to, then by encoder input length (`_sorted_by_length`), and cut into batches;
    each side of a batch is padded to the `PAD_WIDTHS` width of its own longest row. Padding each
    side apart matters when the encoder reads a retrieved answer: its input is then longer than most
    answers, and padding the decoder to the encoder's length (bucketing by the longer side) made half
    of its positions padding.

    With `bucketed=False` every batch is padded to `max_length`, the seed tutorial's way
    (kept for the throughput benchmark).
    """
    keep = fits(answer_ids, max_length)
    if encoder_ids is None:
        encoder_ids = encoder_inputs(question_ids, max_length)
    encoder = tf.ragged.boolean_mask(encoder_ids, keep)
    decoder = add_start_end(tf.ragged.boolean_mask(answer_ids, keep))
    rows = int(encoder.nrows())
    longest = max(max_length, int(tf.reduce_max(encoder.row_lengths())) if rows else 0)

    dataset = tf.data.Dataset.from_tensor_slices((encoder, decoder)).cache()
    if shuffle:
        dataset = dataset.shuffle(rows, seed=seed, reshuffle_each_iteration=True)
    if bucketed:
        dataset = dataset.ragged_batch(batch_size * SORT_WINDOW).map(_sorted_by_length).unbatch()
    dataset = dataset.map(lambda encoder_seq, decoder_seq: ((encoder_seq, decoder_seq[:-1]), decoder_seq[1:]),
                          num_parallel_calls=tf.data.AUTOTUNE)  # teacher forcing
    if bucketed:
        dataset = dataset.padded_batch(batch_size).map(lambda inputs, targets: _pad_to_widths(inputs, targets,
                                                                                              longest, max_length))
        if shuffle:
            dataset = dataset.shuffle(SORT_WINDOW, seed=seed + 1, reshuffle_each_iteration=True)
    else:
        dataset = dataset.padded_batch(batch_size, padded_shapes=(([longest], [max_length]), [max_length]))
    if replicas > 1:  # MirroredStrategy fails on a batch it cannot split evenly: trim the partial one
        dataset = dataset.map(lambda inputs, targets: _even_rows((inputs, targets), replicas))
        dataset = dataset.filter(lambda inputs, targets: tf.shape(targets)[0] > 0)
    else:
        # tf.data cannot see through the sorting how many batches there are; telling it gives the first
        # epoch a real progress bar (not "Unknown") and spares Keras' "input ran out of data" warning.
        dataset = dataset.apply(tf.data.experimental.assert_cardinality(-(-rows // batch_size)))
    return dataset.prefetch(tf.data.AUTOTUNE)


def _sorted_by_length(encoder: tf.RaggedTensor, decoder: tf.RaggedTensor):
    """A window of rows sorted by the `PAD_WIDTHS` width their targets pad to, then by encoder length
    (each batch's decoder side then pads to one width, and its encoder side to about its rows' length;
    on ChatbotData with a retrieved answer, 6% fewer positions in all than sorting by exact answer
    length); ties keep their shuffled order."""
    target_width = tf.searchsorted(tf.constant(PAD_WIDTHS, tf.int64), tf.cast(decoder.row_lengths(), tf.int64) - 1,
                                   out_type=tf.int64)
    order = tf.argsort(target_width * 100_000 + tf.cast(encoder.row_lengths(), tf.int64), stable=True)
    return tf.gather(encoder, order), tf.gather(decoder, order)


def _pad_to_widths(inputs, targets, encoder_length: int, max_length: int):
    """Each side of a batch padded further, from its longest row to the next of `PAD_WIDTHS`, at most
    to the longest the model reads on that side."""
    def padded(ids, most):
        width = tf.shape(ids)[1]
        return tf.pad(ids, [[0, 0], [0, tf.maximum(tf.minimum(bucket(width, PAD_WIDTHS), most), width) - width]])

    encoder, decoder = inputs
    return (padded(encoder, encoder_length), padded(decoder, max_length)), padded(targets, max_length)

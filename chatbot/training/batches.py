"""tf.data batches for training: token ids -> length-grouped teacher-forcing batches.

Owns: the length filter, grouping rows by length, shuffle, cache, prefetch and the teacher-forcing shift. Every
step is a TensorFlow op (no Python per element). Batches are `((encoder_inputs, decoder_inputs), targets)`,
padded with 0. The encoder input itself is composed by `chatbot.model.inputs`.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chatbot.model.inputs import add_start_end, bucket, encoder_inputs

# Widths a batch side is padded up to (its longest row's length, rounded up to one of these), so a
# compiled train step sees a bounded set of shapes.
PAD_WIDTHS = (5, 7, 9, 11, 13, 15, 19, 23, 27, 31, 35, 39, 47, 55, 63, 79, 95, 111, 127)
# Batches are made from windows of this many batches' rows sorted by length (the "sortish" batching of
# fairseq and Hugging Face's group_by_length): each batch holds rows of about the same lengths on both
# sides, and the batches of a window are shuffled again.
SORT_WINDOW = 64



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

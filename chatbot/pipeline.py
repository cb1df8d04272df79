"""tf.data input pipeline: token ids -> bucketed teacher-forcing batches.

Owns: start/end tokens, the length filter and truncation, bucketing by length, shuffle, cache,
prefetch and the teacher-forcing shift. Every step is a TensorFlow op (no Python per element).
Batches are `((encoder_inputs, decoder_inputs), targets)`, padded with 0.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from chatbot.tokenizer import END_ID, SEPARATOR_ID, START_ID, TONE_IDS

# Sequence lengths at which a new bucket starts. Batches are padded to the bucket's boundary,
# so a compiled train step sees only a handful of shapes.
BUCKET_BOUNDARIES = (6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 36, 40, 48, 56, 64, 80, 96, 112, 128)


def add_start_end(ids: tf.RaggedTensor) -> tf.RaggedTensor:
    batch = ids.nrows()
    start = tf.fill([batch, 1], tf.constant(START_ID, ids.dtype))
    end = tf.fill([batch, 1], tf.constant(END_ID, ids.dtype))
    return tf.concat([start, ids, end], axis=1)


def encoder_inputs(question_ids: tf.RaggedTensor, max_length: int, tones=None, context_ids=None,
                   encoder_length: int | None = None) -> tf.RaggedTensor:
    """`[start] tone question [end]`, then `<sep> answer` for each retrieved answer, cut to `encoder_length`.

    The question is cut to `max_length` tokens with its end token kept; `tones` (batch,) int holds
    0/1/2 or -1 for no tone token; `context_ids` (batch, k, None) holds the retrieved answers' ids,
    each cut to `max_length - 1` so that its separator fits in `max_length`."""
    body = question_ids[:, : max_length - 2]
    if tones is not None:
        tones = tf.convert_to_tensor(tones, question_ids.dtype)
        token = tf.gather(tf.constant(TONE_IDS, question_ids.dtype), tf.maximum(tones, 0))
        tone = tf.ragged.boolean_mask(token[:, None], (tones >= 0)[:, None])
        body = tf.concat([tone, body], axis=1)
    ids = add_start_end(body)
    if context_ids is not None:
        answers = context_ids.merge_dims(0, 1)[:, : max_length - 1]  # (batch * k, None)
        separated = tf.concat([tf.fill([answers.nrows(), 1], tf.constant(SEPARATOR_ID, ids.dtype)), answers], axis=1)
        regrouped = tf.RaggedTensor.from_row_lengths(separated, context_ids.row_lengths())  # (batch, k, None)
        ids = tf.concat([ids, regrouped.merge_dims(1, 2)], axis=1)
    return ids[:, : encoder_length or max_length]


def fits(answer_ids: tf.RaggedTensor, max_length: int) -> np.ndarray:
    """Which answers fit in a decoder sequence of `max_length` (+ start/end, minus the shift)."""
    return (answer_ids.row_lengths() + 1 <= max_length).numpy()


def bucketed_batch_count(lengths: np.ndarray, boundaries: list[int], batch_sizes: list[int]) -> int:
    """Batches `bucket_by_sequence_length` makes from sequences of these lengths: bucket i holds
    lengths in [boundaries[i-1], boundaries[i]) in batches of `batch_sizes[i]` (one per bucket,
    len(boundaries) + 1), and each bucket ends with one partial batch."""
    per_bucket = np.bincount(np.searchsorted(boundaries, lengths, side="right"), minlength=len(boundaries) + 1)
    return int(sum(-(-count // size) for count, size in zip(per_bucket, batch_sizes)))


def bucket_batch_sizes(boundaries: list[int], batch_size: int, batch_tokens: int = 0) -> list[int]:
    """Rows per batch for each bucket: `batch_size` everywhere, or with a `batch_tokens` budget as
    many rows as fit in it at the bucket's padded length (short sentences then come in larger
    batches, so each step does a similar amount of work)."""
    if not batch_tokens:
        return [batch_size] * (len(boundaries) + 1)
    padded = [b - 1 for b in boundaries] + [boundaries[-1]]
    return [max(1, batch_tokens // length) for length in padded]


def _even_rows(batch, replicas: int):
    """The first rows of every tensor in `batch`, as many as divide evenly among `replicas`."""
    rows = tf.shape(batch[1])[0]
    return tf.nest.map_structure(lambda t: t[: rows - rows % replicas], batch)


def make_dataset(question_ids: tf.RaggedTensor, answer_ids: tf.RaggedTensor, *, max_length: int,
                 batch_size: int, shuffle: bool = True, seed: int = 42, bucketed: bool = True,
                 encoder_ids: tf.RaggedTensor | None = None, replicas: int = 1,
                 batch_tokens: int = 0) -> tf.data.Dataset:
    """Batches for `Transformer.fit`. Answers too long to end inside `max_length` are dropped
    (a truncated answer would teach the model replies that never end); questions are truncated.
    `encoder_ids`, if given, are the composed encoder inputs (see `encoder_inputs`) and replace
    `[start] question [end]`. With `replicas` > 1, each batch keeps a multiple of `replicas` rows.
    With `batch_tokens`, a bucketed batch holds as many rows as fit in that many padded tokens
    (see `bucket_batch_sizes`) instead of `batch_size`.

    With `bucketed=False` every batch is padded to `max_length`, the seed tutorial's way
    (kept for the throughput benchmark).
    """
    keep = fits(answer_ids, max_length)
    if encoder_ids is None:
        encoder_ids = encoder_inputs(question_ids, max_length)
    encoder = tf.ragged.boolean_mask(encoder_ids, keep)
    decoder = add_start_end(tf.ragged.boolean_mask(answer_ids, keep))
    longest = max(max_length, int(tf.reduce_max(encoder.row_lengths())) if encoder.nrows() else 0)

    # Each pair's bucket length: its longer side once shifted (encoder input or target), computed
    # once here and carried through the pipeline to bucket by and to count the batches with.
    lengths = tf.cast(tf.maximum(encoder.row_lengths(), decoder.row_lengths() - 1), tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((encoder, decoder, lengths)).cache()
    if shuffle:
        dataset = dataset.shuffle(int(encoder.nrows()), seed=seed, reshuffle_each_iteration=True)

    def teacher_forcing(encoder_seq, decoder_seq, length):
        return (encoder_seq, decoder_seq[:-1]), decoder_seq[1:], length

    dataset = dataset.map(teacher_forcing, num_parallel_calls=tf.data.AUTOTUNE)
    if bucketed:
        boundaries = [b for b in BUCKET_BOUNDARIES if b < longest] + [longest + 1]
        sizes = bucket_batch_sizes(boundaries, batch_size, batch_tokens)
        dataset = dataset.bucket_by_sequence_length(
            element_length_func=lambda inputs, targets, length: length,
            bucket_boundaries=boundaries,
            bucket_batch_sizes=sizes,
            pad_to_bucket_boundary=True,
        )
        # tf.data cannot know how many batches bucketing makes; telling it gives the first epoch a
        # real progress bar (not "Unknown") and spares Keras' "input ran out of data" warning.
        if replicas > 1:  # MirroredStrategy fails on a batch it cannot split evenly: trim the partial ones
            dataset = dataset.map(lambda inputs, targets, length: _even_rows((inputs, targets, length), replicas))
            dataset = dataset.filter(lambda inputs, targets, length: tf.shape(targets)[0] > 0)
        else:
            count = bucketed_batch_count(lengths.numpy(), boundaries, sizes)
            dataset = dataset.apply(tf.data.experimental.assert_cardinality(count))
    else:
        dataset = dataset.padded_batch(batch_size, padded_shapes=(([longest], [max_length]), [max_length], []))
    # A bucket pads every part to its boundary, which may pass max_length when the encoder reads
    # retrieved answers: the decoder side is only padding beyond max_length, so it is cut there.
    dataset = dataset.map(lambda inputs, targets, lengths: ((inputs[0], inputs[1][:, :max_length]),
                                                            targets[:, :max_length]))
    return dataset.prefetch(tf.data.AUTOTUNE)

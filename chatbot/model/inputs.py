"""What the encoder reads: the encoder input's layout, composed in one place for training and decoding alike.

Owns: `compose_encoder_inputs` (through `encoder_inputs`): the question with its tone, the messages before it
(`split_turns`), the retrieved answers; start/end tokens, truncation to a window, and `bucket` (a size rounded up
to one of a few shapes). Every step is a TensorFlow op (no Python per element). Must not batch or shuffle
(`chatbot.training.batches`).
"""

from __future__ import annotations

import tensorflow as tf

from chatbot.data.text_tf import in_window, messages_tf
from chatbot.tokenizer.subword import END_ID, SEPARATOR_ID, START_ID, TONE_IDS


def add_start_end(ids: tf.RaggedTensor) -> tf.RaggedTensor:
    batch = ids.nrows()
    start = tf.fill([batch, 1], tf.constant(START_ID, ids.dtype))
    end = tf.fill([batch, 1], tf.constant(END_ID, ids.dtype))
    return tf.concat([start, ids, end], axis=1)


def split_turns(tokenize, texts, turns: int):
    """Strings (batch,) that may hold a conversation (`chatbot.data.text.TURN` between the new message and the
    messages before it, newest first) -> the new messages' ids (batch, None) and, with `turns`, the ids of up to
    `turns` earlier messages (batch, None, None); None when the model reads no context."""
    if not turns:
        return tokenize(texts), None
    parts = messages_tf(texts)
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

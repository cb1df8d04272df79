"""The text rules of `chatbot.data.text` in the graph, for every entry point that reads strings as tensors: the
reply graph, the tokenizer, retrieval and the SavedModel (which runs without Python's side of the package).

Owns: `normalize_tf` (the clean string, from `chatbot.data.text`'s patterns), `one_message_tf`, `messages_tf` (a
string with its conversation split at `TURN`, the one split every graph stage uses: `question_part_tf`,
`chatbot.model.inputs.split_turns`), `with_context_tf` (a message and the messages before it as the one string a
model reads; `chatbot.data.text.with_context` is this function run eagerly) and `in_window`. Must not tokenize.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from chatbot.data.text import CONTEXT_CHARS, CONTROL_CHARS, TURN, WHITESPACE_RUN


def normalize_tf(texts: tf.Tensor) -> tf.Tensor:
    """`chatbot.data.text.normalize` in the graph: NFC, no control characters, single spaces, stripped ends (the same
    patterns; a test holds the two alike on random text)."""
    texts = tf_text.normalize_utf8(texts, "NFC")
    texts = tf.strings.regex_replace(texts, CONTROL_CHARS, "")
    texts = tf.strings.regex_replace(texts, WHITESPACE_RUN, " ")
    return tf.strings.strip(texts)


def one_message_tf(texts: tf.Tensor) -> tf.Tensor:
    """Each string (batch,) kept one message: a `TURN` typed inside it becomes a space, so that no message splits
    itself in two or forges a conversation ("아빠가\x1e때려요" is one message about a father)."""
    return tf.strings.regex_replace(texts, TURN, " ")


def messages_tf(texts: tf.Tensor) -> tf.RaggedTensor:
    """Strings (batch,) that may hold a conversation -> their messages (batch, None): the new one first, then the
    ones before it, newest first."""
    return tf.strings.split(texts, TURN)


def question_part_tf(texts: tf.Tensor) -> tf.Tensor:
    """Each string's new message (batch,)."""
    return messages_tf(texts).to_tensor("")[:, 0]


def in_window(ids: tf.RaggedTensor, first, last) -> tf.RaggedTensor:
    """Each row's items at positions [first, last) (ints or (batch,) tensors; Python slicing's rules are not
    available for ragged inner dimensions)."""
    positions = tf.ragged.range(ids.row_lengths())
    first = tf.cast(first, positions.dtype)[..., None] if tf.is_tensor(first) else first
    last = tf.cast(last, positions.dtype)[..., None] if tf.is_tensor(last) else last
    return tf.ragged.boolean_mask(ids, (positions >= first) & (positions < last))


def with_context_tf(questions: tf.Tensor, history: tf.Tensor, turns: int) -> tf.Tensor:
    """Each question (batch,) and its history (batch, messages; oldest first, "" where a row has fewer) as the one
    string a model reads: the question, then the last `turns` non-empty messages, newest first, each cleaned
    (`normalize_tf`, so no message holds a `TURN` of its own) and cut to its last CONTEXT_CHARS characters,
    separated by `TURN`; the question alone, as one message, when there is nothing to add."""
    questions = one_message_tf(questions)
    if not turns:
        return questions
    messages = normalize_tf(history)
    messages = tf.ragged.boolean_mask(messages, messages != "")
    chars = tf.strings.length(messages.flat_values, unit="UTF8_CHAR")
    start = tf.maximum(chars - CONTEXT_CHARS, 0)
    messages = messages.with_flat_values(tf.strings.substr(messages.flat_values, start, chars - start,
                                                           unit="UTF8_CHAR"))
    lengths = messages.row_lengths()
    earlier = tf.reverse(in_window(messages, lengths - turns, lengths), axis=[1])
    joined = tf.strings.reduce_join(tf.concat([normalize_tf(questions)[:, None], earlier], axis=1), axis=1,
                                    separator=TURN)
    return tf.where(lengths > 0, joined, questions)

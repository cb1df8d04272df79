"""Korean text normalisation shared by training and inference, and what a question may be.

Owns: the one definition of a clean string (Unicode NFC, no control characters, single spaces),
`check_questions`, the one rule every entry point applies to a question before any model work, and a
message with its context as one string (`with_context`, `check_history`): the new message first, then the
messages before it, newest first, separated by `TURN`.
`chatbot.data.text_tf` applies the same rules inside the TensorFlow graph with the patterns defined here, and
`with_context` is its graph function run eagerly.
Hangul jamo such as ㅋ/ㅠ/ㅎ and emoji are kept: in chat they carry meaning.
Must not import TensorFlow at import time (the checks at the edge and the CSV reader run without it).
"""

import re
import unicodedata

from chatbot.config import CONTEXT_TURNS, MAX_QUESTION_CHARS

# Written with literal characters (not \\u escapes) so that both Python's `re` and RE2
# (tf.strings.regex_replace) read the same patterns.
CONTROL_CHARS = "[\x00-\x08\x0b\x0c\x0e-\x1d\x1f\x7f\u200b\ufeff]"
# TURN (ASCII's record separator) parts the messages of one model input; cleaning the whole string folds it
# into a space like other whitespace, so retrieval reads a message and its context as one text.
TURN = "\x1e"
WHITESPACE_RUN = "[ \t\n\r\x0b\x0c\x1e\u00a0\u3000]+"
ROLES = ("user", "assistant")  # a history message's role, as Gradio's chat and OpenAI-style APIs write it
MAX_HISTORY_MESSAGES = 1000  # a longer history is refused; the model reads only its last CONTEXT_TURNS
CONTEXT_CHARS = 200  # an earlier message's last characters kept (the model reads its last max_length // 2 tokens)

_control = re.compile(CONTROL_CHARS)
_whitespace = re.compile(WHITESPACE_RUN)


def normalize(text: str) -> str:
    """NFC, drop control characters, fold whitespace runs into one space, strip the ends."""
    text = unicodedata.normalize("NFC", str(text))
    text = _control.sub("", text)
    return _whitespace.sub(" ", text).strip()


def check_questions(texts) -> list[str]:
    """The questions as a list of strings, each with something to answer (not blank) and at most MAX_QUESTION_CHARS
    characters; ValueError otherwise."""
    if isinstance(texts, str):
        raise ValueError("questions must be a list of strings, not one string")
    texts = list(texts)
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"a question must be a string, got {type(text).__name__}")
        if not normalize(text):  # spaces, control characters: the model would answer a question nobody asked
            raise ValueError("the question is empty")
        if len(question_part(text)) > MAX_QUESTION_CHARS:  # the messages before it are cut by `with_context`
            raise ValueError(f"the question is too long ({len(text):,} characters; at most {MAX_QUESTION_CHARS:,})")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no UTF-8 for the graph to read
                raise ValueError("the question is not valid Unicode text (it holds a lone surrogate)") from None
    return texts


def normalize_turns(text: str) -> str:
    """`normalize` for each message of a string with context, keeping the `TURN` between them (empty ones dropped)."""
    turns = [normalize(turn) for turn in str(text).split(TURN)]
    return TURN.join(turn for turn in turns if turn)


def check_history(history) -> list[str]:
    """The messages of a conversation before the new one, oldest first, as a list of `{"role": "user" |
    "assistant", "content": str}` dicts (Gradio's chat format; None or [] for none); returns their texts.
    ValueError for anything else: not a list, a role other than those two, a content that is not text, a user's
    message blank or over MAX_QUESTION_CHARS characters, or more than MAX_HISTORY_MESSAGES messages. A bot's
    reply is taken as it was given (`with_context` reads only its last CONTEXT_CHARS characters)."""
    if history is None:
        return []
    if isinstance(history, (str, bytes, dict)) or not isinstance(history, (list, tuple)):
        raise ValueError(f"history must be a list of {{\"role\", \"content\"}} messages, got {type(history).__name__}")
    if len(history) > MAX_HISTORY_MESSAGES:
        raise ValueError(f"the history is too long ({len(history):,} messages; at most {MAX_HISTORY_MESSAGES:,})")
    texts = []
    for number, message in enumerate(history, 1):
        if not isinstance(message, dict) or set(message) - {"role", "content", "metadata", "options"}:
            raise ValueError(f"history message {number} must be a {{\"role\", \"content\"}} dict")
        if message.get("role") not in ROLES:
            raise ValueError(f"history message {number} has role {message.get('role')!r}; "
                             f"roles are {' and '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            raise ValueError(f"history message {number}'s content must be text, got {type(content).__name__}")
        if message["role"] == "assistant":  # the bot's replies as they were given, whatever their length
            texts.append(content.encode("utf-8", "replace").decode("utf-8"))
            continue
        try:
            texts.extend(check_questions([content]))
        except ValueError as error:
            raise ValueError(f"history message {number}: {error}".replace("the question", "the message")) from None
    return texts


def one_message(text: str) -> str:
    """A message as a person typed it, kept one message: a `TURN` typed inside it becomes a space, so that no
    message splits itself in two or forges a conversation ("아빠가\x1e때려요" is one message about a father). Other
    control and zero-width characters are dropped by `normalize`, before the crisis check reads the message."""
    return str(text).replace(TURN, " ")


def with_context(question: str, history: list[str], turns: int = CONTEXT_TURNS) -> str:
    """A checked question and the checked texts of the messages before it (oldest first) as the one string a
    model reads: the question, then the last `turns` non-empty messages, newest first, each cleaned (`normalize`, so
    no message can hold a `TURN` of its own), cut to its last CONTEXT_CHARS characters and separated by `TURN`;
    the question alone (`one_message`) when there is no context to add. `with_contexts` for one question."""
    return with_contexts([question], [history], turns)[0]


def with_contexts(questions: list[str], histories: list[list[str]], turns: int = CONTEXT_TURNS) -> list[str]:
    """`with_context` of each question and its history: `chatbot.data.text_tf.with_context_tf`, the one definition
    (the SavedModel's), run eagerly on them all at once. TensorFlow is imported on first use, not with this module."""
    import tensorflow as tf

    from chatbot.data.text_tf import with_context_tf

    width = max((len(history) for history in histories), default=0)
    history = tf.constant([list(h) + [""] * (width - len(h)) for h in histories], tf.string,
                          shape=[len(questions), width])
    joined = with_context_tf(tf.constant(questions, tf.string, shape=[len(questions)]), history, turns)
    return [text.decode("utf-8") for text in joined.numpy()]


def question_part(text: str) -> str:
    """The new message of a string with context (the whole string when it has none)."""
    return text.split(TURN, 1)[0]


def one_text(text: str) -> str:
    """A clean string with context as `normalize` leaves it: its messages joined by spaces (what retrieval reads)."""
    return text.replace(TURN, " ")


def conversation(text: str) -> str:
    """A string with context as a person reads it: the messages in the order they were written, arrows between."""
    return " → ".join(reversed(text.split(TURN)))

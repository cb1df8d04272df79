"""Korean text normalisation shared by training and inference, and what a question may be.

Owns: the one definition of a clean string (Unicode NFC, no control characters, single spaces), and
`check_questions`, the one rule every entry point applies to a question before any model work.
`tokenizer.py` applies the same rules inside the TensorFlow graph with the patterns defined here.
Hangul jamo such as ㅋ/ㅠ/ㅎ and emoji are kept: in chat they carry meaning.
Must not import TensorFlow.
"""

import re
import unicodedata

from chatbot.config import MAX_QUESTION_CHARS

# Written with literal characters (not \\u escapes) so that both Python's `re` and RE2
# (tf.strings.regex_replace) read the same patterns.
CONTROL_CHARS = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u200b\ufeff]"
WHITESPACE_RUN = "[ \t\n\r\x0b\x0c\u00a0\u3000]+"

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
        if len(text) > MAX_QUESTION_CHARS:
            raise ValueError(f"the question is too long ({len(text):,} characters; at most {MAX_QUESTION_CHARS:,})")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate ("\ud800"): no UTF-8 for the graph to read
                raise ValueError("the question is not valid Unicode text (it holds a lone surrogate)") from None
    return texts

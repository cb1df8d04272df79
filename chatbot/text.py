"""Korean text normalisation shared by training and inference.

Owns: the one definition of a clean string (Unicode NFC, no control characters, single spaces).
`tokenizer.py` applies the same rules inside the TensorFlow graph with the patterns defined here.
Hangul jamo such as ㅋ/ㅠ/ㅎ and emoji are kept: in chat they carry meaning.
Must not import TensorFlow.
"""

import re
import unicodedata

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

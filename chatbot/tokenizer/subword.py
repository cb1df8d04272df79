"""Subword tokenizer: a SentencePiece model learned from the training text, run as tensorflow-text ops.

Owns: learning the vocabulary, the reserved ids, in-graph normalisation + tokenisation +
detokenisation (usable in tf.data and inside an exported SavedModel with no Python), save/load.
SentencePiece keeps spaces as part of its pieces, so detokenize(tokenize(text)) gives back the
normalised text exactly ("하루가 또 가네요." stays attached; no "가네요 .").
Must not know about the model.
"""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path

import numpy as np
import sentencepiece
import tensorflow as tf
import tensorflow_text as tf_text

from chatbot.tokenizer.special import (END_ID, NUM_SPECIAL, PAD_ID, RESERVED_TOKENS, SEPARATOR_ID, START_ID,  # noqa: F401
                             TONE_IDS, UNK_ID)
from chatbot.startup import native_notes_quieted
from chatbot.data.text_tf import normalize_tf

SPACE_BEFORE_PUNCTUATION = r" +([.,?!])"
BYTE_PIECE = re.compile(r"(<0x[0-9A-F]{2}>)")  # SentencePiece's piece for one byte of a character it lacks
BYTE_FALLBACK_FROM = 1000  # pieces; the 256 byte pieces would crowd out a smaller vocabulary's subwords


class VocabularyError(ValueError):
    """The vocabulary cannot be learned with these settings (e.g. a target smaller than the data's characters)."""


class Tokenizer:
    """A SentencePiece model wrapped for tensorflow-text. Ids: pad=0, start=1, end=2, unk=3."""

    def __init__(self, model_proto: bytes):
        self.model_proto = model_proto
        with native_notes_quieted():  # SentencePiece notes its normalisation rule in C++ each time one is made
            self.sp = tf_text.SentencepieceTokenizer(model=model_proto, out_type=tf.int32)
        self.vocab_size = int(self.sp.vocab_size())
        self.vocab_hash = hashlib.sha256(model_proto).hexdigest()
        self._pieces = None  # id -> piece text, filled on first use (streaming)

    @classmethod
    def train(cls, texts, vocab_size: int = 8000) -> "Tokenizer":
        """Learn a unigram vocabulary of at most `vocab_size` pieces from normalised texts. A vocabulary of
        BYTE_FALLBACK_FROM pieces or more also holds the 256 UTF-8 bytes: a character it never saw is written
        as its bytes and read back exactly (a model built on it can learn a new FAQ's "휠체어" or "USB");
        a smaller one reads such a character as unknown."""
        texts = [t for t in texts if t]
        if not texts:
            raise ValueError("no text to learn a vocabulary from")
        proto = io.BytesIO()
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(texts),
                model_writer=proto,
                vocab_size=vocab_size,
                hard_vocab_limit=False,  # small data yields fewer pieces instead of an error
                model_type="unigram",
                character_coverage=1.0,  # keep every Hangul syllable, ㅋ/ㅠ and emoji seen in training
                normalization_rule_name="identity",  # NFKC would turn ㅋ into a conjoining jamo; we NFC ourselves
                split_digits=True,
                byte_fallback=vocab_size >= BYTE_FALLBACK_FROM,
                pad_id=PAD_ID, bos_id=START_ID, eos_id=END_ID, unk_id=UNK_ID,
                pad_piece="<pad>", bos_piece="<s>", eos_piece="</s>", unk_piece="<unk>",
                user_defined_symbols=list(RESERVED_TOKENS),
                num_threads=2,
                minloglevel=2,
            )
        except RuntimeError as error:  # "Vocabulary size is smaller than required_chars. 16 vs 150. ..."
            detail = str(error).strip().split("] ")[-1] or type(error).__name__  # without the C++ source location
            raise VocabularyError(f"cannot learn a vocabulary of {vocab_size} pieces from this data ({detail})") from None
        return cls(proto.getvalue())

    def tokenize(self, texts) -> tf.RaggedTensor:
        """Strings (batch,) -> ragged int32 ids (batch, None), without start/end. Text that spells a reserved
        token ("<sep>", "<tone1>") is read as unknown: only the pipeline places separators and tones."""
        ids = self.sp.tokenize(normalize_tf(tf.convert_to_tensor(texts, tf.string)))
        return tf.ragged.map_flat_values(
            lambda flat: tf.where((flat >= SEPARATOR_ID) & (flat < NUM_SPECIAL), UNK_ID, flat), ids)

    def detokenize(self, ids) -> tf.Tensor:
        """Ids (dense or ragged, batch-major) -> strings; special and padding ids are dropped.

        A model can put a piece that starts with a space ("▁.") after a word, which would read
        "가네요 ."; the space before `. , ? !` is removed, so replies never show that artefact."""
        if not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids, tf.int32))
        ids = tf.ragged.boolean_mask(ids, ids >= NUM_SPECIAL)
        return tf.strings.regex_replace(self.sp.detokenize(ids), SPACE_BEFORE_PUNCTUATION, r"\1")

    def pieces(self, ids) -> list[str]:
        """Readable subword pieces for one sequence of ids (for attention plots)."""
        pieces = self.sp.id_to_string(tf.constant(list(ids), tf.int32)).numpy()
        return [p.decode("utf-8").replace("\u2581", " ").strip() or "\u2581" for p in pieces]

    def piece_text(self, token_id: int) -> str:
        """One piece as text, spaces as the \u2581 SentencePiece uses (looked up in Python, no graph call)."""
        if self._pieces is None:
            ids = tf.range(self.vocab_size, dtype=tf.int32)
            self._pieces = [p.decode("utf-8") for p in self.sp.id_to_string(ids).numpy()]
        return self._pieces[token_id] if token_id >= NUM_SPECIAL else ""

    def word_starts(self) -> np.ndarray:
        """Which piece ids begin a word (their piece starts with SentencePiece's \u2581), (vocab_size,) bool: a
        stutter of whole words is said once, a piece repeated inside a word ("바나나") is not (`engine.tidy`)."""
        return np.array([self.piece_text(i).startswith("\u2581") for i in range(self.vocab_size)], bool)

    def encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenize(texts).to_list()

    def decode(self, ids: list[list[int]]) -> list[str]:
        return [s.decode("utf-8") for s in self.detokenize(tf.ragged.constant(ids, dtype=tf.int32)).numpy()]

    def save(self, path: str | Path) -> None:
        """Write the SentencePiece model to the file `path` (its name is the model directory's business)."""
        Path(path).write_bytes(self.model_proto)

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        return cls(Path(path).read_bytes())

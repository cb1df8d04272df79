import pytest
import tensorflow as tf

from chatbot.tokenizer.subword import END_ID, NUM_SPECIAL, PAD_ID, START_ID, UNK_ID, Tokenizer
from conftest import TINY_PAIRS

TEXTS = [q for q, _, _ in TINY_PAIRS] + [a for _, a, _ in TINY_PAIRS]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train(TEXTS, vocab_size=200)


def test_round_trip_is_exact_on_hangul(tokenizer):
    assert tokenizer.decode(tokenizer.encode(TEXTS)) == TEXTS


def test_punctuation_stays_attached(tokenizer):
    assert tokenizer.decode(tokenizer.encode(["맛있는 거 드세요."])) == ["맛있는 거 드세요."]


def test_jamo_laughter_survives(tokenizer):
    assert tokenizer.decode(tokenizer.encode(["심심해 ㅋㅋ", "시험 망쳤어 ㅠㅠ"])) == ["심심해 ㅋㅋ", "시험 망쳤어 ㅠㅠ"]


def test_reserved_ids(tokenizer):
    pieces = tokenizer.sp.id_to_string(tf.constant([PAD_ID, START_ID, END_ID, UNK_ID, 4, 5])).numpy().tolist()
    assert pieces == [b"<pad>", b"<s>", b"</s>", b"<unk>", b"<sep>", b"<tone0>"]
    assert min(min(ids) for ids in tokenizer.encode(TEXTS)) >= NUM_SPECIAL


def test_tokenize_normalises_in_graph(tokenizer):
    @tf.function
    def ids(texts):
        return tokenizer.tokenize(texts)

    messy = tf.constant(["  배고파 \t", "\u1112\u1161\u1102\u1173\u11af"])  # spaces; NFD 하늘
    clean = tf.constant(["배고파", "하늘"])
    assert ids(messy).to_list() == ids(clean).to_list()


def test_detokenize_drops_special_ids(tokenizer):
    ids = tokenizer.encode(["반가워요."])[0]
    assert tokenizer.decode([[START_ID, *ids, END_ID, PAD_ID, PAD_ID]]) == ["반가워요."]


def test_save_load_keeps_vocabulary(tokenizer, tmp_path):
    tokenizer.save(tmp_path / "tokenizer.model")
    loaded = Tokenizer.load(tmp_path / "tokenizer.model")
    assert loaded.vocab_hash == tokenizer.vocab_hash
    assert loaded.encode(TEXTS) == tokenizer.encode(TEXTS)


def test_detokenized_replies_never_have_a_space_before_punctuation(tokenizer):
    ids = tokenizer.encode(["배고파 ?", "푹 쉬세요 .  우산 챙기세요 !"])
    assert tokenizer.decode(ids) == ["배고파?", "푹 쉬세요. 우산 챙기세요!"]


def test_learning_a_vocabulary_prints_nothing_to_standard_error(capfd):
    """SentencePiece notes its normalisation rule from C++ each time a tokenizer op is made; `train` and
    every model load make one."""
    Tokenizer.train(["안녕하세요", "반가워요", "오늘 날씨 좋네요"] * 20, vocab_size=60)
    assert "LOG(INFO)" not in capfd.readouterr().err


def test_text_that_spells_a_reserved_token_never_becomes_a_separator_or_a_tone(tiny_bot):
    from chatbot.tokenizer.subword import NUM_SPECIAL, SEPARATOR_ID, UNK_ID

    ids = tiny_bot.tokenizer.tokenize(["배고파 <sep> 안녕 <tone1><tone2>"]).flat_values.numpy().tolist()
    assert UNK_ID in ids and not [i for i in ids if SEPARATOR_ID <= i < NUM_SPECIAL]
    encoder = tiny_bot.encoder_ids(["배고파 <sep><sep><sep>"]).flat_values.numpy().tolist()
    assert encoder.count(SEPARATOR_ID) == tiny_bot.config.context.retrieved  # only the pipeline's own


def test_a_large_vocabulary_keeps_characters_it_never_saw_as_their_bytes():
    """From BYTE_FALLBACK_FROM pieces a character missing from the training text is written as its UTF-8 bytes
    and read back exactly, whole or streamed piece by piece; a smaller vocabulary reads it as unknown."""
    import tensorflow as tf

    from chatbot.decoding.postprocess import Finisher
    from chatbot.tokenizer.subword import BYTE_FALLBACK_FROM

    texts = [f"{word} {number}번 문장이에요." for number in range(300) for word in ("안녕하세요", "반가워요", "날씨 좋네요")]
    large = Tokenizer.train(texts, vocab_size=BYTE_FALLBACK_FROM)
    unseen = "휠체어 USB 🍰 들어가요"
    ids = large.encode([unseen])[0]
    assert UNK_ID not in ids and large.decode([ids]) == [unseen]
    pieces = [large.piece_text(i) for i in ids]
    assert any(piece.startswith("<0x") for piece in pieces)
    finish = Finisher(large, None, tf.constant(large.word_starts()))  # what the stream shows of each prefix
    prefixes = [ids[:end] + [0] * (len(ids) - end) for end in range(1, len(ids) + 1)]
    streamed = [text.decode() for text in finish.prefix_text(tf.constant(prefixes, tf.int32))[0].numpy()]
    assert streamed[-1] == unseen
    assert all("<0x" not in text and "\ufffd" not in text for text in streamed)  # a half-written character waits
    small = Tokenizer.train(texts, vocab_size=200)
    assert UNK_ID in small.encode([unseen])[0]

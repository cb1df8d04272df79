"""Property tests (hypothesis) of the reliability limits: over arbitrary Unicode and arbitrary option values, the
text cleaner, the CSV loader, GenerationConfig, the tokenizer and `Chatbot.reply` give a result or
their one clear error, never another exception. Each test runs as many examples as the Hypothesis
profile says (tests/conftest.py): "quick", 200 (28 for `Chatbot.reply`, whose new option combinations each trace a
decoder), unless HYPOTHESIS_PROFILE=thorough asks for 2,000 (or CHATBOT_PROPERTY_EXAMPLES)."""

import csv
import io
import re

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from chatbot.config import GenerationConfig
from chatbot.data.pairs import DataError, QAPair, load_pairs
from chatbot.data.text import normalize
from conftest import TINY_PAIRS

# Each new option combination of `Chatbot.reply` traces a decoder: it gets a seventh of the profile's examples.
FEWER_FOR_REPLIES = settings(max_examples=max(1, settings().max_examples // 7))

cells = st.text(max_size=30)
tables = st.lists(st.lists(cells, min_size=0, max_size=4), max_size=8)
encodings = st.sampled_from(["utf-8", "utf-8-sig", "cp949", "shift_jis", "latin-1", "utf-16"])
any_value = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10),
                      st.lists(st.integers(), max_size=2))
option_values = st.dictionaries(st.sampled_from([f.name for f in GenerationConfig.__dataclass_fields__.values()]),
                                any_value)


def check_normalize(text):
    cleaned = normalize(text)
    assert cleaned == normalize(cleaned) and cleaned == cleaned.strip() and "  " not in cleaned


def write_table(path, header, rows, encoding, raw_tail):
    buffer = io.StringIO()
    csv.writer(buffer).writerows([header, *rows])
    try:
        data = buffer.getvalue().encode(encoding)
    except UnicodeEncodeError:
        data = buffer.getvalue().encode("utf-8")
    path.write_bytes(data + raw_tail)


def check_loader(tmp_path, header, rows, encoding, raw_tail):
    path = tmp_path / "fuzz.csv"
    write_table(path, header, rows, encoding, raw_tail)
    try:
        pairs, report = load_pairs(path)
    except DataError as error:
        assert str(path) in str(error)
        return
    assert pairs and all(isinstance(p, QAPair) and p.question and p.answer for p in pairs)
    assert report.used == len(pairs) <= report.rows_read


def check_generation_config(values):
    for make in (lambda: GenerationConfig(**values), lambda: GenerationConfig.from_values(values)):
        try:
            settings_ = make()
        except ValueError:
            continue
        assert isinstance(settings_, GenerationConfig)


headers = st.one_of(st.just(["Q", "A", "label"]), st.just(["question", "answer"]), st.lists(cells, max_size=4))
raw_tails = st.one_of(st.just(b""), st.binary(max_size=20))

TRAINING_TEXTS = [q for q, _, _ in TINY_PAIRS] + [a for _, a, _ in TINY_PAIRS]
# Text made only of characters the tokenizer has seen (and any whitespace), so nothing becomes <unk>.
known_text = st.text(st.sampled_from(sorted(set("".join(TRAINING_TEXTS)) | set(" \t\n\u3000"))), max_size=60)
# Around the 1,000-character cap, and well beyond it.
long_text = st.builds(lambda piece, count: piece * count, st.text(min_size=1, max_size=3), st.integers(300, 1100))
questions = st.one_of(st.text(), known_text, long_text)
floats = st.one_of(st.floats(), st.floats(0, 3))
# Values near and past every bound. Few valid (strategy, beam width, n-gram size) combinations, as each compiles.
decoding = st.fixed_dictionaries({}, optional={
    "strategy": st.sampled_from(["greedy", "beam", "sample", "nucleus", ""]),
    "max_new_tokens": st.one_of(st.integers(-2, 50), st.integers(2**31 - 2, 2**40)),
    "num_beams": st.sampled_from([-1, 0, 1, 2, 4, 8, 9, 99, 2**31]),
    "length_penalty": floats, "agreement": floats, "mbr": floats, "temperature": floats, "top_p": floats, "repetition_penalty": floats,
    "top_k": st.one_of(st.integers(-2, 100), st.integers(2**31 - 2, 2**40)),
    "no_repeat_ngram_size": st.sampled_from([-1, 0, 1, 2, 3, 16, 17, 999]),
    "seed": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
})


@pytest.fixture(scope="module")
def tokenizer():
    from chatbot.tokenizer.subword import Tokenizer

    return Tokenizer.train(TRAINING_TEXTS, vocab_size=200)


def check_tokenizer(tokenizer, text, ids):
    assert isinstance(tokenizer.decode(tokenizer.encode([text]))[0], str)
    assert isinstance(tokenizer.decode([[i % tokenizer.vocab_size for i in ids]])[0], str)


def check_round_trip(tokenizer, text):
    """Normalised text comes back exactly, except the space before . , ? ! that replies never show."""
    assert tokenizer.decode(tokenizer.encode([text])) == [re.sub(r" +([.,?!])", r"\1", normalize(text))]


def check_reply(bot, question, options):
    try:
        reply = bot.reply(question, **options)
    except ValueError:
        event("refused with a ValueError")
        return
    event("answered")
    assert isinstance(reply, str)


@given(st.text())
def test_normalize_is_idempotent_on_any_unicode(text):
    check_normalize(text)


@given(headers, tables, encodings, raw_tails)
def test_csv_loader_gives_pairs_or_a_data_error(tmp_path, header, rows, encoding, raw_tail):
    check_loader(tmp_path, header, rows, encoding, raw_tail)


@given(option_values)
def test_generation_config_is_a_config_or_a_value_error(values):
    check_generation_config(values)


@given(text=st.text(), ids=st.lists(st.integers(0, 2**31 - 1), max_size=30))
def test_tokenize_and_detokenize_never_raise_on_any_unicode_or_ids(tokenizer, text, ids):
    check_tokenizer(tokenizer, text, ids)


@given(known_text)
def test_tokenizer_round_trips_normalised_text(tokenizer, text):
    check_round_trip(tokenizer, text)


@FEWER_FOR_REPLIES
@given(questions, decoding)
@example("", {"strategy": "sample", "top_p": 3.973625367851203e-171})  # 0.0 in float32: once an InvalidArgumentError
def test_reply_is_a_string_or_a_value_error_for_any_question_and_options(tiny_bot, question, options):
    check_reply(tiny_bot, question, options)

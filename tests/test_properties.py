"""Property tests (hypothesis) for issue 14: over arbitrary Unicode and arbitrary option values, the
text cleaner, the CSV loader and GenerationConfig give a result or their one clear error, never
another exception. The default lane runs a few hundred examples; the slow lane ≥ 2,000 each."""

import csv
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatbot.config import GenerationConfig
from chatbot.data import DataError, QAPair, load_pairs
from chatbot.text import normalize

QUICK = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
THOROUGH = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

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


@QUICK
@given(st.text())
def test_normalize_is_idempotent_on_any_unicode(text):
    check_normalize(text)


@QUICK
@given(headers, tables, encodings, raw_tails)
def test_csv_loader_gives_pairs_or_a_data_error(tmp_path, header, rows, encoding, raw_tail):
    check_loader(tmp_path, header, rows, encoding, raw_tail)


@QUICK
@given(option_values)
def test_generation_config_is_a_config_or_a_value_error(values):
    check_generation_config(values)


@pytest.mark.slow
@THOROUGH
@given(st.text())
def test_normalize_is_idempotent_on_any_unicode_thoroughly(text):
    check_normalize(text)


@pytest.mark.slow
@THOROUGH
@given(headers, tables, encodings, raw_tails)
def test_csv_loader_gives_pairs_or_a_data_error_thoroughly(tmp_path, header, rows, encoding, raw_tail):
    check_loader(tmp_path, header, rows, encoding, raw_tail)


@pytest.mark.slow
@THOROUGH
@given(option_values)
def test_generation_config_is_a_config_or_a_value_error_thoroughly(values):
    check_generation_config(values)

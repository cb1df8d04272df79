"""The bundled Korean set in data/: it loads cleanly and is fit to train the default model on."""

from collections import Counter
from pathlib import Path

import pytest

from chatbot.data import load_pairs

BUNDLED = Path(__file__).resolve().parent.parent / "data" / "korean_chat.csv"
MAX_LENGTH = 40  # ModelConfig's default


@pytest.fixture(scope="module")
def loaded():
    return load_pairs(BUNDLED)


def test_loads_with_zero_dropped_rows(loaded):
    pairs, report = loaded
    assert report.rows_read == len(pairs) >= 3000
    assert not report.dropped_empty and not report.dropped_duplicates


def test_pairs_and_questions_are_distinct(loaded):
    pairs, _ = loaded
    assert len({(p.question, p.answer) for p in pairs}) == len(pairs)
    assert len({p.question for p in pairs}) == len(pairs)  # one answer per question


def test_paraphrased_questions_share_answers(loaded):
    pairs, _ = loaded
    per_answer = Counter(p.answer for p in pairs)
    assert sum(count >= 2 for count in per_answer.values()) >= 0.8 * len(per_answer)


def test_every_label_is_valid_and_balanced(loaded):
    pairs, _ = loaded
    labels = Counter(p.label for p in pairs)
    assert set(labels) == {0, 1, 2}
    shares = {label: count / len(pairs) for label, count in labels.items()}
    assert all(0.15 <= share <= 0.6 for share in shares.values()), shares


def test_every_pair_fits_max_length_after_tokenization(loaded, tmp_path):
    from chatbot.tokenizer import Tokenizer

    pairs, _ = loaded
    texts = [p.question for p in pairs] + [p.answer for p in pairs]
    tokenizer = Tokenizer.train(texts, 4000)
    lengths = tokenizer.tokenize(texts).row_lengths().numpy()
    assert lengths.max() + 2 <= MAX_LENGTH  # with the start and end tokens


def test_questions_are_written_as_people_type(loaded):
    pairs, _ = loaded
    questions = [p.question for p in pairs]
    assert sum("ㅋ" in q or "ㅠ" in q or "ㅎ" in q for q in questions) >= 50
    assert sum(q.endswith("요") or q.endswith("요?") for q in questions) >= 200  # polite

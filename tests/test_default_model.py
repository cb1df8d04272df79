"""The default model shipped in models/default: it loads, it learned its data, and it stays on topic.

The model was trained on the bundled set plus ChatbotData (README, "The default model"). The checks
that need its exact training split read the files named in its config.json and skip when the
ChatbotData copy beside the checkout (`../shared`) is absent. Thresholds sit a little below what the
committed model measured (in each test's docstring), so a worse retrained model fails here.
"""

from collections import Counter
from pathlib import Path

import pytest

from chatbot.config import ChatbotConfig
from chatbot.data.pairs import load_pairs, split_by_question
from chatbot.data.datasets import load_sources
from topics import TOPIC_QUESTIONS, on_topic

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "default"
SHARED_DATA = ROOT.parent / "shared" / "data"
SPECIAL_PIECES = ("<pad>", "<s>", "</s>", "<unk>", "<sep>", "<tone", "\u2581")


@pytest.fixture(scope="module")
def default_bot():
    """Decoding as a plain graph: these tests judge the model's replies, which XLA leaves the same
    (test_engine.py), and each XLA compilation of the full-size model for a new batch shape or
    setting took seconds (the file ran 36 s alone with XLA, 23 s without)."""
    from chatbot.decoding.chatbot import Chatbot

    return Chatbot.load(DEFAULT_MODEL, compilation="graph")


@pytest.fixture(scope="module")
def training_files():
    data = ChatbotConfig.read(DEFAULT_MODEL / "config.json").data
    # `download` puts ChatbotData in data/; the copy beside the checkout (../shared/data) is the same file.
    paths = [ROOT / path if (ROOT / path).is_file() else SHARED_DATA / Path(path).name for path in data.paths]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        pytest.skip(f"training data not here: {', '.join(missing)}")
    return load_sources([str(path) for path in paths], log=lambda *_: None), data


def test_it_is_small_enough_to_keep_in_git():
    assert sum(f.stat().st_size for f in DEFAULT_MODEL.rglob("*") if f.is_file()) < 50 * 2**20


def test_the_topic_questions_are_in_no_training_file(training_files):
    pairs, _ = training_files
    known = {p.question for p in pairs}
    assert not [q for q, _ in TOPIC_QUESTIONS if q in known]


@pytest.mark.slow  # loads the full-size model
def test_new_everyday_sad_and_happy_questions_get_varied_replies_on_their_topic(default_bot):
    """24 questions written for this test, in no training file. The committed model's default reply (its own
    greedy decoding, copying a retrieved answer when it decides to): 24 different replies, 11 of them on topic
    (tests/topics.py: whole words, so one fixed reply is on topic for one or two questions at most). Counting
    distinct replies keeps a model that gives one reply for everything from passing, with or without ../shared."""
    questions = [q for q, _ in TOPIC_QUESTIONS]
    replies = default_bot.reply_batch(questions)
    hits = {reply for (_, topic_words), reply in zip(TOPIC_QUESTIONS, replies) if on_topic(reply, topic_words)}
    assert len(set(replies)) >= 20, list(zip(questions, replies))
    assert len(hits) >= 10, list(zip(questions, replies))


def test_topic_words_are_words_not_syllables():
    """A single syllable (자, 잘, 일, 비, 좋...) sits in replies on every topic: "마음이 힘들 땐 잘 쉬세요." once
    counted as on topic for 14 of the 24 questions."""
    assert all(len(word) >= 2 for _, topic_words in TOPIC_QUESTIONS for word in topic_words)
    assert sum(on_topic("마음이 힘들 땐 잘 쉬세요.", topic_words) for _, topic_words in TOPIC_QUESTIONS) <= 2
    assert on_topic("맛있는 거 드세요.", ("맛있",)) and not on_topic("먹구름이 꼈어요.", ("구름",))  # words begin


@pytest.mark.slow  # a quality check: hundreds of replies
def test_bundled_questions_get_their_answers(default_bot):
    """256 questions of the bundled set, evenly spread (256: a batch bucket, so no row is padding), with the answers
    the model was trained on (its own index: data/ may have been rewritten since). Each retrieves its own answer,
    and the committed model's own decoding copies it for 252 of them."""
    asked = {p.question for p in load_pairs(ROOT / "data" / "korean_chat.csv")[0]}
    counts = Counter(p.question for p in default_bot.retriever.pairs)
    pairs = [p for p in default_bot.retriever.pairs if p.question in asked and counts[p.question] == 1]
    sample = pairs[::len(pairs) // 256][:256]
    replies = default_bot.reply_batch([p.question for p in sample])
    exact = sum(reply == p.answer for reply, p in zip(replies, sample)) / len(sample)
    assert exact >= 0.95, f"only {exact:.0%} of bundled questions got their answer"


@pytest.mark.slow  # a quality check: hundreds of replies
def test_held_out_questions_get_varied_replies(default_bot, training_files):
    """The validation questions of its own training run: varied replies, not one sentence for all."""
    pairs, data = training_files
    _, held_out = split_by_question(pairs, data.val_fraction, data.seed)
    replies = default_bot.reply_batch([p.question for p in held_out[:256]])
    assert len(set(replies)) / len(replies) >= 0.5


@pytest.mark.slow  # loads the full-size model
def test_it_answers_the_readme_question_in_korean_in_every_tone(default_bot):
    for tone in (None, "everyday", "sad", "love"):
        reply = default_bot.reply("오늘 너무 피곤해", tone=tone)
        assert reply and any("가" <= ch <= "힣" for ch in reply)
        assert not any(special in reply for special in SPECIAL_PIECES)


@pytest.mark.slow  # tokenizes every answer of the index
def test_tidying_leaves_every_answer_of_its_index_as_it_is(default_bot):
    """`tidy` says a stutter once and cuts a repeated phrase; a training answer is neither, so it leaves all of
    them alone ("바나나나", "190000" and "음..." repeat pieces inside a word)."""
    import numpy as np
    import tensorflow as tf

    from chatbot.decoding.postprocess import tidy
    from chatbot.tokenizer.subword import END_ID, PAD_ID

    answers = sorted({p.answer for p in default_bot.retriever.pairs})
    length = default_bot.max_length
    rows = [row[:length - 1] + [END_ID] + [PAD_ID] * (length - 1 - len(row[:length - 1]))
            for row in default_bot.tokenizer.encode(answers)]
    tidied = tidy(tf.constant(rows, tf.int32), default_bot.word_starts).numpy()
    changed = [answer for answer, row, out in zip(answers, rows, tidied) if not np.array_equal(out, row)]
    assert len(answers) > 20000 and changed == []

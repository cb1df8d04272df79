"""The default model shipped in models/default: it loads, and it learned the bundled set.

Measured on the bundled data with the split the model was trained with (config.json). When the
model was committed: 41% of training questions got exactly their answer; of the 350 held-out
paraphrases (questions it never saw, whose answer it learned from other wordings) 96% got one of
the set's answers and 43% an answer of their own label, against 37% for guessing by label shares.
The thresholds sit a little below those figures, so a worse retrained model fails here.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

from chatbot.data import load_pairs, split_by_question

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL = ROOT / "models" / "default"
SPECIAL_PIECES = ("<pad>", "<s>", "</s>", "<unk>", "<sep>", "<tone")


@pytest.fixture(scope="module")
def default_bot():
    from chatbot.generate import Chatbot

    return Chatbot.load(DEFAULT_MODEL)


@pytest.fixture(scope="module")
def split():
    config = json.loads((DEFAULT_MODEL / "config.json").read_text(encoding="utf-8"))
    pairs, _ = load_pairs(ROOT / config["data"]["path"])
    return split_by_question(pairs, config["data"]["val_fraction"], config["data"]["seed"]), pairs


def test_it_is_small_enough_to_keep_in_git():
    assert sum(f.stat().st_size for f in DEFAULT_MODEL.rglob("*") if f.is_file()) < 50 * 2**20


@pytest.mark.slow  # a quality check: hundreds of replies
def test_training_questions_get_their_answers(default_bot, split):
    (train, _), _ = split
    sample = train[::10]  # every tenth, about 300 questions
    replies = default_bot.reply_batch([p.question for p in sample])
    exact = sum(reply == p.answer for reply, p in zip(replies, sample)) / len(sample)
    assert exact >= 0.35, f"only {exact:.0%} of training questions got their answer"


@pytest.mark.slow  # a quality check: hundreds of replies
def test_held_out_paraphrases_get_a_known_answer_of_their_label_more_often_than_chance(default_bot, split):
    (_, held_out), pairs = split
    label_of_answer = {p.answer: p.label for p in pairs}
    replies = default_bot.reply_batch([p.question for p in held_out])
    known = sum(reply in label_of_answer for reply in replies) / len(held_out)
    same_label = sum(label_of_answer.get(reply) == p.label for reply, p in zip(replies, held_out)) / len(held_out)
    shares = Counter(p.label for p in held_out)
    chance = sum((count / len(held_out)) ** 2 for count in shares.values())
    assert known >= 0.9, f"only {known:.0%} of held-out replies are answers of the set"
    assert same_label >= chance + 0.03, f"{same_label:.0%} of held-out paraphrases got their label; chance {chance:.0%}"


@pytest.mark.slow  # loads the full-size model
def test_it_answers_the_readme_question_in_korean(default_bot):
    reply = default_bot.reply("오늘 너무 피곤해")
    assert reply and any("가" <= ch <= "힣" for ch in reply)
    assert not any(special in reply for special in SPECIAL_PIECES)

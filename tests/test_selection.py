"""Choosing what training keeps: the questions it asks, the epoch whose replies score best, the rerank weights."""

import csv

import pytest
import sacrebleu

from chatbot.training.evaluate import reply_metrics
from chatbot.training.best_epoch import (MIN_UNIQUE, RERANK_FIT_CANDIDATES, fit_rerank_weights, selection_score, unsampled,
                               validation_sample)


@pytest.mark.parametrize("count", [0, 7, 500, 999, 1001, 1474])
def test_the_unsampled_validation_pairs_are_exactly_those_no_selection_asked(count):
    pairs = [f"q{i}" for i in range(count)]
    asked, fresh = validation_sample(pairs), unsampled(pairs)
    assert len(asked) == min(count, 500) and not set(asked) & set(fresh)
    assert sorted(asked + fresh, key=lambda q: int(q[1:])) == pairs


def test_selection_never_prefers_a_collapsed_epoch_to_a_varied_one():
    assert selection_score(9.9, 0.002) < selection_score(0.5, MIN_UNIQUE)  # one reply for all, however close
    assert selection_score(3.0, 0.1) < selection_score(1.0, 0.3) < selection_score(1.0, 0.9) < selection_score(2.0, 0.9)


@pytest.mark.slow  # trains a model for three epochs
def test_training_keeps_the_epoch_with_the_best_validation_replies(tiny_csv, tmp_path, monkeypatch):
    import dataclasses

    import chatbot.training.best_epoch
    from chatbot.data.pairs import load_pairs, split_by_question
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.retrieval.retriever import Retriever
    from chatbot.training.train import train
    from conftest import REPEATS, tiny_config

    config = tiny_config(epochs=3)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, val_fraction=0.3))
    pairs, _ = load_pairs(tiny_csv)
    pairs = pairs * (REPEATS // 4)  # a quarter of the session model's steps: the scores need not be good, only kept right
    monkeypatch.setattr(chatbot.training.best_epoch, "MIN_RERANK_FIT", 1)  # so that its nine validation questions fit the weights
    out = train(pairs, config, tmp_path / "m", verbose=0, log=lambda *_: None)
    with open(out / "history.csv", encoding="utf-8") as file:
        history = list(csv.DictReader(file))
    scores = [float(row["val_select"]) for row in history]
    assert len(scores) == 3 and all(row["val_chrf"] and row["val_unique"] for row in history)
    train_pairs, val = split_by_question(pairs, 0.3, config.data.seed)
    saved = Chatbot.load(out)  # its index holds the validation pairs too; training retrieved from train_pairs
    assert saved.config.rerank.fitted_on == len(val)  # its rerank weights were chosen on them
    bot = Chatbot(saved.model, saved.tokenizer, saved.config, retriever=Retriever(train_pairs), compilation="eager")
    kept = reply_metrics(bot.reply_batch([p.question for p in val], candidates=0), [p.answer for p in val])
    assert selection_score(kept["chrf"], kept["unique_ratio"]) == pytest.approx(max(scores), abs=1e-6)


def test_too_few_validation_questions_keep_the_default_rerank_weights_and_say_so(tiny_bot):
    from chatbot.config import RerankConfig
    from chatbot.data.pairs import QAPair
    from chatbot.training.best_epoch import MIN_RERANK_FIT, fit_rerank

    lines = []
    few = [QAPair(f"질문 {i}", "답이에요.") for i in range(MIN_RERANK_FIT - 1)]
    assert fit_rerank(tiny_bot, few, lines.append) == tiny_bot.config.rerank == RerankConfig()
    assert fit_rerank(tiny_bot, few * 3, lines.append) == RerankConfig()  # repeated pairs are no new questions
    assert lines == 2 * [f"reranking weights: the defaults, as {MIN_RERANK_FIT - 1} validation questions are too few "
                         f"to fit them on (at least {MIN_RERANK_FIT})"]


@pytest.mark.slow  # traces the eight-candidate reply graph for three batch shapes and two configs
def test_fitted_rerank_weights_do_no_worse_than_the_defaults_and_score_what_decoding_gives(tiny_bot):
    """Questions the tiny model never saw, with answers of its training set as references: the weights
    fitted on them do at least as well as the defaults, and their chrF is what replies decoded with them get."""
    import dataclasses

    from chatbot.decoding.chatbot import Chatbot

    asked = {"배고픈데 뭐 먹지": "맛있는 거 드세요.", "비가 많이 와": "우산 챙기세요.", "헤어지고 너무 힘들어": "많이 힘들겠어요.",
             "오늘 좀 피곤하네": "푹 쉬세요.", "시험 또 망쳤다": "다음엔 잘할 거예요.", "생일이야": "생일 축하해요!"}
    questions, references = list(asked), list(asked.values())
    weights, chrf = fit_rerank_weights(tiny_bot, questions, references, batch_size=3)  # two batches
    default_chrf = sacrebleu.corpus_chrf(tiny_bot.reply_batch(questions, candidates=RERANK_FIT_CANDIDATES),
                                        [references]).score
    assert weights.fitted_on == len(questions) and chrf >= default_chrf
    fitted = Chatbot(tiny_bot.model, tiny_bot.tokenizer, dataclasses.replace(tiny_bot.config, rerank=weights),
                     retriever=tiny_bot.retriever, compilation="eager")  # one batch: nothing to trace
    replies = fitted.reply_batch(questions, candidates=RERANK_FIT_CANDIDATES)  # the option the weights are for
    assert sacrebleu.corpus_chrf(replies, [references]).score == pytest.approx(chrf)

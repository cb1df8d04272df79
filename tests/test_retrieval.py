"""Retrieval inside the graph, the composed encoder input, and tone: checked against plain Python."""

import json
import math
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from chatbot.config import ChatbotConfig, ContextConfig, ModelConfig
from chatbot.data import QAPair, load_pairs, split_by_question
from chatbot.pipeline import encoder_inputs
from chatbot.retrieval import Retriever, char_bigrams, index_json
from chatbot.tokenizer import END_ID, SEPARATOR_ID, START_ID, TONE_IDS
from chatbot.train import context_for
from conftest import ROOT


def reference_similarity(train_questions, question):
    """scikit-learn's TfidfVectorizer(analyzer=char bigrams, smooth_idf, l2) cosine, in plain Python."""
    docs = [Counter(char_bigrams(q)) for q in train_questions]
    df = Counter(g for doc in docs for g in doc)
    idf = {g: math.log((1 + len(docs)) / (1 + n)) + 1 for g, n in df.items()}
    query = {g: c * idf[g] for g, c in Counter(char_bigrams(question)).items() if g in idf}
    query_norm = math.sqrt(sum(w * w for w in query.values())) or 1.0
    scores = []
    for doc in docs:
        weights = {g: c * idf[g] for g, c in doc.items()}
        norm = math.sqrt(sum(w * w for w in weights.values())) or 1.0
        scores.append(sum(query.get(g, 0.0) * w / norm for g, w in weights.items()) / query_norm)
    return np.array(scores)


@pytest.fixture(scope="module")
def bundled_split():
    pairs, _ = load_pairs(ROOT / "data" / "korean_chat.csv")
    return split_by_question(pairs, 0.05, 0)


def test_similarity_equals_tf_idf_cosine_computed_in_python(bundled_split):
    train, held_out = bundled_split
    train = train[:400]
    retriever = Retriever(train)
    questions = [p.question for p in held_out[:20]] + ["ㅋ", "", "완전히 새로운 문장 abc 123"]
    graph = retriever.similarity(tf.constant(questions)).numpy()
    for row, question in zip(graph, questions):
        np.testing.assert_allclose(row, reference_similarity([p.question for p in train], question), atol=1e-5)
    assert graph.max() <= 1 + 1e-5
    itself = retriever.similarity(tf.constant([train[7].question])).numpy()[0]
    assert itself[retriever.pairs.index(train[7])] == pytest.approx(1.0, abs=1e-5)


def test_a_training_question_never_retrieves_its_own_row_when_leaving_one_out():
    pairs = [QAPair("배고파", "밥 먹어요.", 0), QAPair("배고파 죽겠어", "뭐라도 드세요.", 0),
             QAPair("배고프다", "간식 어때요?", 0), QAPair("졸려", "자요.", 0)]
    retriever = Retriever(pairs)
    itself = retriever.nearest(["배고파"], 1).numpy()[0, 0].decode()
    assert itself == "밥 먹어요."  # without leave-one-out the question finds itself
    found = retriever.leave_one_out(pairs, 2, [-1] * len(pairs))
    for pair, answers in zip(pairs, found):
        assert pair.answer not in answers, pair


def test_asking_a_tone_prefers_rows_with_that_label():
    pairs = [QAPair("오늘 하루 어땠어", "평범했어요.", 0), QAPair("오늘 하루 어땠니", "좀 슬펐어요.", 1),
             QAPair("오늘 하루 어땠냐", "설레는 날이었어요.", 2)]
    retriever = Retriever(pairs)
    for tone, expected in enumerate(["평범했어요.", "좀 슬펐어요.", "설레는 날이었어요."]):
        assert retriever.nearest(["오늘 하루 어땠"], 1, [tone]).numpy()[0, 0].decode() == expected


def test_the_index_round_trips_and_drops_repeated_rows():
    pairs = [QAPair("안녕", "반가워요.", None), QAPair("안녕", "반가워요.", None), QAPair("잘 자", "좋은 꿈!", 1)]
    loaded = Retriever.from_json(index_json(pairs))
    assert loaded.pairs == [pairs[0], pairs[2]] and len(loaded) == 2


def test_encoder_input_is_start_tone_question_end_then_a_separator_before_each_answer():
    question = tf.ragged.constant([[10, 11, 12], [20]])
    context = tf.RaggedTensor.from_uniform_row_length(tf.ragged.constant([[30, 31], [32], [40], [41, 42, 43]]), 2)
    ids = encoder_inputs(question, 6, tones=tf.constant([1, -1]), context_ids=context, encoder_length=11)
    assert ids.to_list() == [
        [START_ID, TONE_IDS[1], 10, 11, 12, END_ID, SEPARATOR_ID, 30, 31, SEPARATOR_ID, 32],
        [START_ID, 20, END_ID, SEPARATOR_ID, 40, SEPARATOR_ID, 41, 42, 43]]
    # Without context or tone it is the plain tutorial input, cut to max_length with its end kept.
    assert encoder_inputs(tf.ragged.constant([[1, 2, 3, 4, 5, 6, 7]]), 6).to_list() == [
        [START_ID, 1, 2, 3, 4, END_ID]]


def test_tone_is_learned_only_from_data_with_labels_and_the_encoder_makes_room():
    config = ChatbotConfig(model=ModelConfig(max_length=10), context=ContextConfig(retrieved=2, tone=True))
    labelled = context_for(config, [QAPair("a", "b", 1)])
    assert labelled.context.tone and labelled.model.encoder_length == 10 + 2 * 10 + 1
    unlabelled = context_for(config, [QAPair("a", "b", None)])
    assert not unlabelled.context.tone and unlabelled.model.encoder_length == 30
    plain = context_for(ChatbotConfig(context=ContextConfig(retrieved=0, tone=False)), [QAPair("a", "b", 1)])
    assert plain.model.encoder_length == 0


def test_models_saved_before_context_existed_read_as_question_only():
    raw = json.loads(ChatbotConfig().to_json())
    del raw["context"]
    old = ChatbotConfig.from_json(json.dumps(raw))
    assert old.context.retrieved == 0 and not old.context.tone
    assert ChatbotConfig.from_json(ChatbotConfig().to_json()).context == ContextConfig()


def test_a_chatbot_reads_retrieved_answers_and_checks_the_tone(tiny_bot):
    ids = tiny_bot.decoder.encoder_ids(tf.constant(["배고파"]), tf.constant([1])).to_list()[0]
    assert ids[:2] == [START_ID, TONE_IDS[1]] and ids.count(SEPARATOR_ID) == tiny_bot.config.context.retrieved
    assert tiny_bot.reply("배고파", tone="sad") == tiny_bot.reply("배고파", tone=1)
    for bad in ("angry", 3, -1, True):
        with pytest.raises(ValueError, match="tone must be"):
            tiny_bot.reply("배고파", tone=bad)


def test_gold_answers_join_the_candidates_of_the_asked_share_of_training_pairs():
    from chatbot.train import _with_gold

    pairs = [QAPair(f"질문 {i}", f"답 {i}", None) for i in range(400)]
    found = [["다른 답 a", "다른 답 b"] for _ in pairs]
    for rate in (0.0, 0.5, 1.0):
        config = ChatbotConfig(context=ContextConfig(gold_rate=rate))
        mixed = _with_gold(pairs, found, config)
        share = sum(p.answer in row for p, row in zip(pairs, mixed)) / len(pairs)
        assert abs(share - rate) < 0.08 and all(len(row) == 2 for row in mixed)
    assert _with_gold(pairs, found, config) == mixed  # seeded

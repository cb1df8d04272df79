"""Retrieval inside the graph, the composed encoder input, and tone: checked against plain Python."""

import dataclasses
import json
import math
import random
from collections import Counter

import numpy as np
import pytest
import tensorflow as tf

from chatbot.config import CHARACTERS_ONLY, ChatbotConfig, ContextConfig, ModelConfig
from chatbot.training.neighbours import answer_likeness, context_for, noised, with_gold_biased, with_own_answer
from chatbot.data.pairs import QAPair, load_pairs, split_by_question
from chatbot.model.inputs import encoder_inputs
from chatbot.retrieval.retriever import (COMMON_BIGRAM_COUNT, COMMON_CHAR_COUNT, COMMON_CHAR_SHARE, Retriever, char_grams, index_json,
                               tf_idf_postings)
from chatbot.tokenizer.subword import END_ID, SEPARATOR_ID, START_ID, TONE_IDS
from conftest import ROOT


def indexed_grams(questions):
    """Each question's n-gram counts, less the characters too common to index, and each n-gram's document count."""
    docs = [Counter(char_grams(q)) for q in questions]
    df = Counter(g for doc in docs for g in doc)
    common = {g for g, n in df.items() if len(g) == 1 and n > max(COMMON_CHAR_SHARE * len(docs), COMMON_CHAR_COUNT)}
    docs = [Counter({g: c for g, c in doc.items() if g not in common}) for doc in docs]
    return docs, Counter({g: n for g, n in df.items() if g not in common})


def reference_similarity(train_questions, question):
    """scikit-learn's TfidfVectorizer(analyzer="char", ngram_range=(1, 2), smooth_idf, l2) cosine, in plain Python,
    without the common characters."""
    docs, df = indexed_grams(train_questions)
    idf = {g: math.log((1 + len(docs)) / (1 + n)) + 1 for g, n in df.items()}
    query = {g: c * idf[g] for g, c in Counter(char_grams(question)).items() if g in idf}
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
    for pair, neighbours in zip(pairs, found):
        assert pair not in neighbours and all(n.question != pair.question for n in neighbours), pair


def test_leaving_one_out_finds_for_each_row_what_its_own_lookup_would_when_pairs_repeat():
    """Repeated rows share one lookup per question and tone; each row still gets its own neighbours."""
    pairs = [QAPair("배고파", "밥 먹어요.", 0), QAPair("배고파 죽겠어", "뭐라도 드세요.", 1),
             QAPair("배고프다", "간식 어때요?", 0), QAPair("졸려", "자요.", 2)]
    retriever = Retriever(pairs)
    repeated = pairs * 3  # as the schedule repeats a small set; tones vary as tone dropout makes them
    tones = [-1 if i % 3 else pair.label for i, pair in enumerate(repeated)]  # each question with and without
    questions, answers = retriever.neighbours([p.question for p in repeated], 2, tones, leave_one_out=True)
    expected = [[(q.decode(), a.decode()) for q, a in zip(*row)] for row in zip(questions.numpy(), answers.numpy())]
    found = retriever.leave_one_out(repeated, 2, tones, batch_size=3)  # in batches, the last one short
    assert [[(n.question, n.answer) for n in row] for row in found] == expected


def test_asking_a_tone_prefers_rows_with_that_label():
    pairs = [QAPair("오늘 하루 어땠어", "평범했어요.", 0), QAPair("오늘 하루 어땠니", "좀 슬펐어요.", 1),
             QAPair("오늘 하루 어땠냐", "설레는 날이었어요.", 2)]
    retriever = Retriever(pairs)
    for tone, expected in enumerate(["평범했어요.", "좀 슬펐어요.", "설레는 날이었어요."]):
        assert retriever.nearest(["오늘 하루 어땠"], 1, [tone]).numpy()[0, 0].decode() == expected


def test_the_index_round_trips_and_drops_repeated_rows():
    pairs = [QAPair("안녕", "반가워요.", None), QAPair("안녕", "반가워요.", None), QAPair("잘 자", "좋은 꿈!", 1)]
    loaded = Retriever.from_json(index_json(pairs))
    assert loaded.pairs == (pairs[0], pairs[2]) and len(loaded) == 2


def reference_postings(questions):
    """The inverted index built the plain way: each n-gram's idf, and its (row, weight) postings, characters
    before bigrams, each in code point order."""
    docs, df = indexed_grams(questions)
    idf = {g: math.log((1 + len(docs)) / (1 + n)) + 1 for g, n in df.items()}
    postings = {g: [] for g in sorted(df, key=lambda g: (len(g), g))}
    for row, doc in enumerate(docs):
        norm = math.sqrt(sum((count * idf[g]) ** 2 for g, count in doc.items()))
        for g, count in doc.items():
            postings[g].append((row, count * idf[g] / norm))
    return idf, postings


def test_the_index_built_with_arrays_is_the_one_built_the_plain_way(bundled_split):
    questions = [p.question for p in bundled_split[0]] + ["", "ㅋ", "ㅋㅋㅋㅋ", "😀😀 좋아", "가나다 가나다", "a"]
    keys, idf, starts, rows, weights = tf_idf_postings(questions)
    expected_idf, postings = reference_postings(questions)
    assert keys == list(postings)
    assert " " not in keys and "요" not in keys and "배" in keys and "배고" in keys  # common characters are not indexed
    np.testing.assert_allclose(idf, [expected_idf[g] for g in keys], rtol=1e-6)
    assert starts.tolist() == np.cumsum([0] + [len(p) for p in postings.values()]).tolist()
    assert rows.tolist() == [row for p in postings.values() for row, _ in p]
    np.testing.assert_allclose(weights, [w for p in postings.values() for _, w in p], rtol=1e-6)
    assert tf_idf_postings(["", ""])[0] == [""] and tf_idf_postings([""])[2].tolist() == [0, 0]  # nothing to index


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


def test_a_neighbours_question_comes_between_start_and_end_before_its_answer():
    question = tf.ragged.constant([[10, 11], [20]])
    answers = tf.RaggedTensor.from_uniform_row_length(tf.ragged.constant([[30, 31], [40]]), 1)
    asked = tf.RaggedTensor.from_uniform_row_length(tf.ragged.constant([[50], [60, 61, 62, 63, 64, 65]]), 1)
    ids = encoder_inputs(question, 6, context_ids=answers, encoder_length=40, context_question_ids=asked)
    assert ids.to_list() == [
        [START_ID, 10, 11, END_ID, SEPARATOR_ID, START_ID, 50, END_ID, 30, 31],
        [START_ID, 20, END_ID, SEPARATOR_ID, START_ID, 60, 61, 62, 63, END_ID, 40]]  # cut as the asked one


def test_tone_is_learned_only_from_data_with_labels_and_the_encoder_makes_room():
    config = ChatbotConfig(model=ModelConfig(max_length=10), context=ContextConfig(retrieved=2, tone=True))
    labelled = context_for(config, [QAPair("a", "b", 1)])
    assert labelled.context.tone and labelled.model.encoder_length == 10 + 2 * 10 + 1
    unlabelled = context_for(config, [QAPair("a", "b", None)])
    assert not unlabelled.context.tone and unlabelled.model.encoder_length == 30
    with_questions = context_for(dataclasses.replace(config, context=ContextConfig(retrieved=2, questions=True)),
                                 [QAPair("a", "b", None)])
    assert with_questions.model.encoder_length == 10 + 2 * 2 * 10
    plain = context_for(ChatbotConfig(context=ContextConfig(retrieved=0, tone=False)), [QAPair("a", "b", 1)])
    assert plain.model.encoder_length == 0


def test_models_saved_before_context_existed_read_as_question_only():
    raw = json.loads(ChatbotConfig().to_json())
    del raw["context"]
    old = ChatbotConfig.from_json(json.dumps(raw))
    assert old.context.retrieved == 0 and not old.context.tone
    assert ChatbotConfig.from_json(ChatbotConfig().to_json()).context == ContextConfig()


def test_a_chatbot_reads_retrieved_answers_and_checks_the_tone(tiny_bot):
    ids = tiny_bot.encoder_ids(tf.constant(["배고파"]), tf.constant([1])).to_list()[0]
    assert ids[:2] == [START_ID, TONE_IDS[1]] and ids.count(SEPARATOR_ID) == tiny_bot.config.context.retrieved
    assert tiny_bot.reply("배고파", tone="sad") == tiny_bot.reply("배고파", tone=1)
    for bad in ("angry", 3, -1, True):
        with pytest.raises(ValueError, match="tone must be"):
            tiny_bot.reply("배고파", tone=bad)


def test_own_answers_join_the_candidates_of_the_asked_share_of_training_pairs():
    pairs = [QAPair(f"질문 {i}", f"답 {i}", None) for i in range(400)]
    found = [[QAPair("다른 질문", "다른 답 a"), QAPair("또 다른 질문", "다른 답 b")] for _ in pairs]
    for rate in (0.0, 0.5, 1.0):
        mixed = with_own_answer(pairs, found, rate, seed=7)
        share = sum(p in row for p, row in zip(pairs, mixed)) / len(pairs)
        assert abs(share - rate) < 0.08 and all(len(row) == 2 for row in mixed)
    assert with_own_answer(pairs, found, 0.5, seed=7) == with_own_answer(pairs, found, 0.5, seed=7)


def test_a_neighbour_answering_alike_joins_the_candidates_of_the_asked_share_of_training_pairs():
    pairs = [QAPair(f"질문 {i}", f"답은 {i}번입니다", None) for i in range(400)]
    far = [QAPair("먼 질문 a", "전혀 다른 말"), QAPair("먼 질문 b", "상관없는 말")]
    pools = [far + [QAPair("가까운 질문", f"답은 {i}번입니다!"), QAPair("남", "엉뚱")] for i in range(len(pairs))]
    for rate in (0.0, 0.5, 1.0):
        chosen = with_gold_biased(pairs, pools, 2, rate, seed=7)
        share = sum(any(n.question == "가까운 질문" for n in row) for row in chosen) / len(pairs)
        assert abs(share - rate) < 0.08 and all(len(row) == 2 for row in chosen)
        assert all(n.answer != p.answer for p, row in zip(pairs, chosen) for n in row)  # the alike one, not its own
    assert with_gold_biased(pairs, pools, 2, 0.5, seed=7) == with_gold_biased(pairs, pools, 2, 0.5, seed=7)


def test_with_no_neighbour_answering_alike_the_pair_itself_joins_with_its_question_noised():
    pairs = [QAPair(f"오늘 회의가 너무 길었어 {i}", f"고생 많았어요 {i}", None) for i in range(200)]
    unlike = [[QAPair("q", "zz"), QAPair("r", "yy"), QAPair("s", "xx")] for _ in pairs]
    chosen = with_gold_biased(pairs, unlike, 2, 1.0, seed=7)
    for pair, row in zip(pairs, chosen):
        own = [n for n in row if n.answer == pair.answer]
        assert len(own) == 1 and own[0].question != pair.question  # never the tell of its exact question
        assert set(own[0].question) <= set(pair.question)


def test_noising_drops_characters_but_never_everything():
    rng = random.Random(0)
    texts = [noised("오늘 회의가 너무 길었어", rng) for _ in range(50)]
    assert all(t and set(t) <= set("오늘 회의가 너무 길었어") and "  " not in t for t in texts)
    assert len(set(texts)) > 10 and noised("아", random.Random(1)) == "아"


def test_answer_likeness_is_one_for_the_same_text_and_zero_for_nothing_shared():
    assert answer_likeness("좋아요", "좋아요") == 1.0 and answer_likeness("좋아요", "싫군") == 0.0
    assert 0 < answer_likeness("정말 좋아요", "좋아요!") < 1 and answer_likeness("아", "아") == 1.0


@pytest.mark.slow  # trains a tiny model
def test_with_questions_each_neighbours_question_is_shown_and_decoding_matches_the_naive_loop(tmp_path):
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.training.train import train
    from conftest import REPEATS, TINY_PAIRS, tiny_config

    pairs = [QAPair(q, a, label) for q, a, label in TINY_PAIRS]
    config = dataclasses.replace(tiny_config(epochs=1, repeats=1), context=ContextConfig(retrieved=2, questions=True))
    train(pairs * (REPEATS // 4), config, tmp_path / "m", verbose=0, log=lambda *_: None)
    bot = Chatbot.load(tmp_path / "m", compilation="eager")  # one reply: nothing to trace
    assert bot.config.context.questions and bot.config.context.retrieved == 2
    question = "배고파 죽겠어"
    asked, answers = bot.retriever.neighbours([question], 2)
    ids = bot.encoder_ids(tf.constant([question])).to_list()[0]
    expected = [START_ID, *bot.tokenizer.encode([question])[0], END_ID]
    for neighbour_question, answer in zip(asked.numpy()[0], answers.numpy()[0]):
        expected += [SEPARATOR_ID, START_ID, *bot.tokenizer.encode([neighbour_question.decode()])[0], END_ID,
                     *bot.tokenizer.encode([answer.decode()])[0]]
    assert ids == expected
    assert bot.reply(question, candidates=0) == bot.naive_reply(question)


def test_answer_documents_find_a_row_by_the_words_of_its_answer():
    """A message that shares nothing with a question but asks for what its answer says is found through the
    answer's document (its questions and the answer text), not by characters alone."""
    from chatbot.config import RetrievalConfig

    pairs = [QAPair("쉬는 날 있어요?", "매주 월요일은 쉬어요."), QAPair("주차 돼요?", "건물 뒤 공영주차장을 이용해 주세요."),
             QAPair("언제 문 열어요?", "오전 9시부터 오후 9시까지 영업해요.")]
    asked = tf.constant(["영업시간 알려줘"])
    by_characters = Retriever(pairs).similarity(asked).numpy()[0]  # a space is all it shares with any question
    assert by_characters[2] <= by_characters[0]
    by_answers = Retriever(pairs, RetrievalConfig(characters=0.0, answers=1.0, meaning=0.0)).nearest(asked, 1)
    assert by_answers.numpy()[0, 0].decode() == pairs[2].answer


def test_meaning_needs_the_sentence_encoder():
    from chatbot.config import RetrievalConfig

    with pytest.raises(ValueError, match="sentence encoder"):
        Retriever([QAPair("배고파", "밥 드세요.")], RetrievalConfig(meaning=1.0))


def test_the_calibrated_threshold_lets_the_asked_share_of_in_scope_questions_fall_back():
    from chatbot.retrieval.retriever import calibrated_threshold

    pairs, _ = load_pairs(ROOT / "data" / "examples" / "shop_faq.csv")
    retriever = Retriever(pairs)
    threshold = calibrated_threshold(retriever, pairs, [], share=0.25)  # no held-out questions: paraphrases
    # as calibrated: each question with siblings scores its best row of another question (its own text left out)
    questions = [p.question for p in dict.fromkeys(pairs)]
    best = [max(score for other, score in zip(questions, reference_similarity(questions, pair.question))
                if other != pair.question)
            for pair in dict.fromkeys(p for p in pairs if sum(q.answer == p.answer for q in pairs) > 1)]
    assert threshold == pytest.approx(float(np.quantile(best, 0.25)), abs=1e-4)
    strict = Retriever(pairs, dataclasses.replace(CHARACTERS_ONLY, threshold=0.5))
    assert strict.confident(tf.constant(["몇 시에 문 열어요?", "ㅁㄴㅇㄹ 퀀텀"])).numpy().tolist() == [True, False]
    unique = [QAPair(f"질문 {i}", f"답 {i}") for i in range(5)]  # no answer has two questions: nothing to calibrate on
    assert calibrated_threshold(Retriever(unique), unique, []) == 0.0


def test_a_bigram_in_nearly_every_question_is_not_indexed_but_the_bundled_datas_commonest_is():
    """A template's shared bigrams ("qu", "n ", " 질") would make every lookup expand every row's postings; the
    bundled data's commonest bigram, in 15% of its questions, is still indexed."""
    templated = [f"question {i} 질문" for i in range(COMMON_BIGRAM_COUNT + 200)]
    keys = set(tf_idf_postings(templated)[0])
    assert not keys & {"qu", "ue", "n ", " 질", "질문"} and "12" in keys
    as_common = [f"배고파 {i}" for i in range(8500)] + [f"나 이 {i}" for i in range(1500)]  # "이 " in 15% of them
    assert "이 " in set(tf_idf_postings(as_common)[0])
    small_faq = [f"배고파 {i}" for i in range(100)] + [f"나 이 {i}" for i in range(900)]  # in 90%, but 900 rows
    assert "이 " in set(tf_idf_postings(small_faq)[0])

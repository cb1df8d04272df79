"""The sentence encoder: its contrastive loss, and training that brings a group's phrasings together."""

import numpy as np
import pytest
from keras import ops

from chatbot.data.pairs import QAPair
from chatbot.model.sentence import SentenceEncoder, answer_groups, contrastive_loss, embed, fit_sentence_encoder, pad
from chatbot.tokenizer.subword import Tokenizer

# Phrasings of four messages that share almost no characters with each other: only meaning groups them.
GROUPS = [["배고파", "밥 먹고 싶다", "출출해", "뭐 좀 먹을까"], ["졸려", "잠 온다", "눈이 감겨", "자고 싶어"],
          ["심심해", "할 게 없어", "지루하다", "놀고 싶어"], ["추워", "손이 시려", "날씨가 차갑네", "몸이 떨려"]]


def test_the_loss_prefers_each_rows_own_positive_and_ignores_its_groups_other_rows():
    anchors = ops.convert_to_tensor(np.eye(3, 4, dtype="float32"))
    matched = float(contrastive_loss(anchors, anchors, ops.convert_to_tensor([0, 1, 2])))
    swapped = float(contrastive_loss(anchors, anchors[::-1], ops.convert_to_tensor([0, 1, 2])))
    assert matched < 0.01 < swapped
    same = ops.convert_to_tensor(np.ones((2, 4), "float32") / 2)  # two rows that cannot be told apart
    assert float(contrastive_loss(same, same, ops.convert_to_tensor([0, 0]))) < 0.01  # one group: no negative
    assert float(contrastive_loss(same, same, ops.convert_to_tensor([0, 1]))) > 0.6  # two groups: ln 2 each way


def test_answer_groups_put_the_questions_of_one_answer_with_that_answer():
    texts, groups = answer_groups([QAPair("배고파", "밥 드세요."), QAPair("출출해", "밥 드세요."),
                                   QAPair("졸려", "주무세요."), QAPair("배고파", "밥 드세요.")])
    named = sorted(sorted(texts[i] for i in group) for group in groups)
    assert named == [["밥 드세요.", "배고파", "출출해"], ["졸려", "주무세요."]]


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer.train([text for group in GROUPS for text in group] * 4, vocab_size=120)


def nearest_in_group(encoder, tokenizer) -> float:
    texts = [text for group in GROUPS for text in group]
    owner = np.repeat(np.arange(len(GROUPS)), [len(group) for group in GROUPS])
    vectors = embed(encoder, tokenizer.encode(texts))
    similarity = vectors @ vectors.T - 10 * np.eye(len(texts))
    return float(np.mean(owner[similarity.argmax(1)] == owner))


def test_training_brings_each_groups_phrasings_nearest_each_other(tokenizer):
    texts = [text for group in GROUPS for text in group]
    where = {text: i for i, text in enumerate(texts)}
    untrained = SentenceEncoder(tokenizer.vocab_size, d_model=32, num_layers=1, dff=64)
    before = nearest_in_group(untrained, tokenizer)
    # No dropout, and enough steps that the result does not hang on the initial weights, which depend on what
    # else this process built before (Keras' global seed generator).
    encoder = fit_sentence_encoder(tokenizer.encode(texts), [[where[t] for t in group] for group in GROUPS],
                                   tokenizer.vocab_size, epochs=80, batch_size=8, seed=1,
                                   encoder=SentenceEncoder(tokenizer.vocab_size, d_model=32, num_layers=1, dff=64,
                                                           dropout=0.0))
    assert before < 0.75 and nearest_in_group(encoder, tokenizer) == 1.0
    vectors = embed(encoder, tokenizer.encode(texts))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_padding_never_changes_an_embedding(tokenizer):
    encoder = SentenceEncoder(tokenizer.vocab_size, d_model=32, num_layers=1, dff=64)
    ids = tokenizer.encode(["배고파"])
    short = ops.convert_to_numpy(encoder(pad(ids, 8)))
    long = ops.convert_to_numpy(encoder(pad(ids, 32)))
    assert np.allclose(short, long, atol=1e-5)

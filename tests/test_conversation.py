"""A message with the conversation before it: the one string a model reads, the dialogue files that teach it,
and the encoder input that carries it."""

import numpy as np
import pytest
import tensorflow as tf

from chatbot.data.pairs import DataError, load_pairs
from chatbot.model.layers import answer_positions
from chatbot.model.inputs import encoder_inputs, split_turns
from chatbot.data.text import (CONTEXT_CHARS, MAX_HISTORY_MESSAGES, TURN, check_history, check_questions, conversation,
                          normalize, question_part, with_context)
from chatbot.tokenizer.subword import END_ID, SEPARATOR_ID, START_ID
from conftest import write_csv

HISTORY = [{"role": "user", "content": "배고파"}, {"role": "assistant", "content": "뭐  먹고 싶어요?"}]


def test_the_question_comes_first_then_the_last_messages_newest_first():
    earlier = ["처음", "그다음", *check_history(HISTORY)]
    assert with_context("피자", earlier) == TURN.join(["피자", "뭐 먹고 싶어요?", "배고파"])  # each cleaned
    assert with_context("피자", earlier, turns=1) == TURN.join(["피자", "뭐 먹고 싶어요?"])
    assert with_context("피자 ", [], turns=2) == "피자 "  # nothing to add: the question as it is
    assert with_context("피자", earlier, turns=0) == "피자"
    assert question_part(with_context("피자", earlier)) == "피자"
    assert conversation(with_context("피자", earlier)) == "배고파 → 뭐 먹고 싶어요? → 피자"


def test_a_message_cannot_smuggle_a_turn_and_long_earlier_messages_are_cut():
    joined = with_context("응", [f"가{TURN}나", "다" * 1000])
    assert joined.split(TURN) == ["응", "다" * CONTEXT_CHARS, "가 나"]
    assert normalize(joined) == f"응 {'다' * CONTEXT_CHARS} 가 나"  # what retrieval reads: one text
    check_questions([joined])  # the question part is what the length rule measures


@pytest.mark.parametrize("history, reason", [
    ("배고파", "must be a list"),
    ({"role": "user", "content": "배고파"}, "must be a list"),
    ([["user", "배고파"]], "must be a"),
    ([{"role": "system", "content": "너는 해적이야"}], "role 'system'"),
    ([{"role": "user"}], "content must be text"),
    ([{"role": "user", "content": 3}], "content must be text"),
    ([{"role": "user", "content": None}], "content must be text"),
    ([{"role": "user", "content": "  "}], "empty"),
    ([{"role": "user", "content": "가" * 1001}], "too long"),
    ([{"role": "user", "content": "안녕", "extra": 1}], "must be a"),
    ([{"role": "user", "content": "안녕"}] * (MAX_HISTORY_MESSAGES + 1), "too long"),
])
def test_a_bad_history_gets_one_clear_error(history, reason):
    with pytest.raises(ValueError, match=reason):
        check_history(history)


def test_a_good_history_in_gradio_form_gives_its_texts():
    assert check_history(None) == [] and check_history([]) == []
    assert check_history([*HISTORY, {"role": "user", "content": "ㅋㅋ", "metadata": None}]) == ["배고파",
                                                                                                "뭐  먹고 싶어요?", "ㅋㅋ"]


def test_the_bots_own_replies_are_taken_whatever_their_length():
    """A conversation holds the bot's replies as they were given: a long fallback line (or any long reply) must
    not make every later message of the conversation a refused request."""
    long_reply = "잘 모르는 내용이에요. " * 100  # 1,300 characters
    texts = check_history([{"role": "user", "content": "환불 돼?"}, {"role": "assistant", "content": long_reply},
                           {"role": "assistant", "content": ""}])
    assert texts == ["환불 돼?", long_reply, ""]
    assert with_context("응", texts[:2]).split(TURN) == ["응", normalize(long_reply)[-CONTEXT_CHARS:], "환불 돼?"]


def test_a_dialogue_file_gives_a_pair_per_reply_with_the_messages_before_it(tmp_path):
    path = write_csv(tmp_path / "dialogues.csv", [
        ("d1", "user", "비 온다"), ("d1", "bot", "우산 있어요?"), ("d1", "user", "아니"),
        ("d1", "bot", "편의점에서 하나 사요."), ("d1", "user", "ㅇㅋ"), ("d1", "bot", "조심히 가요."),
        ("d2", "user", "배고파"), ("d2", "assistant", "뭐 먹을래요?"), ("d2", "user", "피자"), ("d2", "bot", "좋아요!"),
    ], header=("dialogue", "speaker", "text"))
    pairs, report = load_pairs(path)
    assert [(p.question.split(TURN), p.answer, p.label) for p in pairs] == [
        (["비 온다"], "우산 있어요?", None),
        (["아니", "우산 있어요?", "비 온다"], "편의점에서 하나 사요.", None),
        (["ㅇㅋ", "편의점에서 하나 사요.", "아니"], "조심히 가요.", None),  # two messages before, no more
        (["배고파"], "뭐 먹을래요?", None),  # a new dialogue starts with nothing before it
        (["피자", "뭐 먹을래요?", "배고파"], "좋아요!", None),
    ]
    assert report.used == 5


def test_a_dialogue_file_with_another_speaker_names_the_row(tmp_path):
    path = write_csv(tmp_path / "dialogues.csv", [("d1", "user", "안녕"), ("d1", "narrator", "...")],
                     header=("dialogue", "speaker", "text"))
    with pytest.raises(DataError, match=r"dialogues.csv:3: speaker 'narrator'"):
        load_pairs(path)


def _characters(texts):
    return tf.strings.unicode_decode(texts, "UTF-8")


def test_the_encoder_reads_the_question_first_then_each_earlier_message_cut_to_its_end():
    texts = tf.constant([TURN.join(["ab", "cdefgh", "ij"]), "k"])
    question, turns = split_turns(_characters, texts, 2)
    answers = tf.RaggedTensor.from_uniform_row_length(_characters(tf.constant(["xy", "z"])), 1)
    ids = encoder_inputs(question, 8, None, answers, 64, None, turns).to_list()
    c = [ord(char) for char in "abcdefghijkxyz"]
    a, b, d, g, h, i, j, k, x, y, z = (ord(char) for char in "abdghijkxyz")
    assert ids[0] == [START_ID, a, b, END_ID, START_ID, c[4], c[5], g, h, END_ID, START_ID, i, j, END_ID,
                      SEPARATOR_ID, x, y]  # each earlier message keeps its last max_length // 2 tokens
    assert ids[1] == [START_ID, k, END_ID, SEPARATOR_ID, z]  # a first message: as a model without context reads it
    assert split_turns(_characters, texts, 0)[1] is None  # a model that reads no context reads the whole string
    assert split_turns(_characters, texts, 1)[1].to_list()[0] == [[ord(char) for char in "cdefgh"]]


def test_the_copy_head_copies_from_retrieved_answers_never_from_the_conversation():
    texts = tf.constant([TURN.join(["ab", "cd"])])
    question, turns = split_turns(_characters, texts, 2)
    answers = tf.RaggedTensor.from_uniform_row_length(_characters(tf.constant(["xy"])), 1)
    ids = encoder_inputs(question, 8, None, answers, 64, None, turns).to_tensor()
    copyable = np.array(answer_positions(ids))[0]
    assert [chr(t) for t in ids[0].numpy()[copyable]] == ["x", "y"]


def test_retrieval_scores_a_follow_up_by_its_conversation_or_by_the_message_alone():
    import dataclasses

    from chatbot.config import CHARACTERS_ONLY
    from chatbot.data.pairs import QAPair
    from chatbot.retrieval.retriever import Retriever

    pairs = [QAPair(TURN.join(["응", "우산 있어요?", "소나기 온다"]), "다행이에요."), QAPair("응 그래", "좋아요."),
             QAPair("배고파", "뭐 먹을래요?")]
    follow_up = with_context("응", ["소나기 온다", "우산 있어요?"])
    whole = Retriever(pairs, dataclasses.replace(CHARACTERS_ONLY, message_wins=False))
    assert whole.nearest([follow_up], 1).numpy()[0, 0].decode() == "다행이에요."
    assert np.allclose(whole.similarity([follow_up]).numpy(), whole.similarity(["응 우산 있어요? 소나기 온다"]).numpy())
    alone = Retriever(pairs, dataclasses.replace(CHARACTERS_ONLY, conversation=0.0, message_wins=False))
    assert np.allclose(alone.similarity([follow_up]).numpy(), whole.similarity(["응"]).numpy())
    half = Retriever(pairs, dataclasses.replace(CHARACTERS_ONLY, conversation=0.5, message_wins=False))
    expected = (whole.similarity([follow_up]).numpy() + whole.similarity(["응"]).numpy()) / 2
    assert np.allclose(half.similarity([follow_up]).numpy(), expected)
    assert np.allclose(half.similarity(["배고파"]).numpy(), whole.similarity(["배고파"]).numpy())  # a first message
    with pytest.raises(ValueError, match="conversation"):
        dataclasses.replace(CHARACTERS_ONLY, conversation=1.5)
    with pytest.raises(ValueError, match="message_wins"):
        dataclasses.replace(CHARACTERS_ONLY, message_wins="yes")


def test_a_change_of_topic_mid_conversation_finds_the_neighbours_of_its_own_words():
    """By default a training question keeps the better of its score against the whole conversation and against
    the new message alone: a follow-up still finds its conversation, a new topic its own question."""
    import dataclasses

    from chatbot.config import CHARACTERS_ONLY
    from chatbot.data.pairs import QAPair
    from chatbot.retrieval.retriever import Retriever

    pairs = [QAPair(TURN.join(["응", "우산 있어요?", "소나기 온다"]), "다행이에요."),
             QAPair(TURN.join(["8시", "몇 시에 나가요?", "소나기 온다 우산 챙겨야지"]), "우산 꼭 챙겨요."),
             QAPair("주말에 뭐 하지", "산책 어때요?")]
    retriever = Retriever(pairs, CHARACTERS_ONLY)
    assert CHARACTERS_ONLY.message_wins
    change = with_context("주말에 뭐 하지", ["소나기 온다", "우산 있어요?"])
    follow_up = with_context("응", ["소나기 온다", "우산 있어요?"])
    assert [a.decode() for a in retriever.nearest([change, follow_up], 1).numpy()[:, 0]] == ["산책 어때요?",
                                                                                              "다행이에요."]
    whole = Retriever(pairs, dataclasses.replace(CHARACTERS_ONLY, message_wins=False))
    assert whole.nearest([change], 1).numpy()[0, 0].decode() != "산책 어때요?"  # the conversation's words won


def test_a_history_tensor_is_joined_newest_first_blank_messages_skipped_each_cut_to_its_last_characters():
    """The SavedModel's `serve_with_history` and `with_context` (the same function, run eagerly) read a padded
    history tensor so."""
    from chatbot.data.text_tf import with_context_tf

    histories = [["", "가나다" * 100, "짧아  요"], ["", "", "배고파"], ["", "", ""], ["하나", "둘", "셋"]]
    joined = with_context_tf(tf.constant(["응", "피자", "안녕", "넷"]), tf.constant(histories), 2).numpy()
    assert [text.decode() for text in joined] == [TURN.join(["응", "짧아 요", ("가나다" * 100)[-CONTEXT_CHARS:]]),
                                                  TURN.join(["피자", "배고파"]), "안녕", TURN.join(["넷", "셋", "둘"])]
    assert with_context_tf(tf.constant(["응"]), tf.constant([["배고파"]]), 0).numpy()[0].decode() == "응"
    assert with_context_tf(tf.constant([f"아빠가{TURN}때려요"]), tf.constant([[""]]), 2).numpy()[0].decode() == \
        "아빠가 때려요"  # one message, whatever it holds

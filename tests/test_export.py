import json
import os
import subprocess
import sys

import pytest

from chatbot.safety.keywords import ABUSE_REPLY, SELF_HARM_REPLY
from conftest import TINY_PAIRS, follow_up_answer

# Runs in a fresh interpreter that must never import the chatbot package.
SERVE = """
import json, sys
import tensorflow as tf
import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)
model = tf.saved_model.load(sys.argv[1])
questions = json.loads(sys.argv[2])
plain = model.signatures["serving_default"](questions=tf.constant(questions))["replies"]
sad = model.signatures["serve_with_tone"](questions=tf.constant(questions),
                                          tones=tf.fill([len(questions)], 1))["replies"]
history = tf.constant([["", "소나기 온다", "우산 있어요?"], ["", "", "출출해"], ["", "", ""], ["죽고 싶어", "힘들었겠어요", "출출해"]])
followed = model.signatures["serve_with_history"](questions=tf.constant(["응", "응", "응", "응"]), history=history,
                                                  tones=tf.fill([4], -1))["replies"]
assert "chatbot" not in sys.modules
print(json.dumps([[r.decode("utf-8") for r in replies.numpy()] for replies in (plain, sad, followed)],
                 ensure_ascii=False))
"""


@pytest.mark.slow  # a TensorFlow subprocess
def test_saved_model_answers_like_chatbot_without_the_package(tiny_bot, tiny_saved_model, tmp_path):
    """Retrieval, the tone token, the conversation before a message (padded with "") and decoding all run inside
    the SavedModel."""
    assert tiny_bot.config.context.retrieved and tiny_bot.has_tone
    out = tiny_saved_model  # `export_saved_model` of the tiny model
    # a record separator or a zero-width space typed inside a message leaves it one message
    questions = ["안녕하세요", *[q for q, _, _ in TINY_PAIRS[1:8]], "처음 보는 질문", "죽고 싶어", "아빠가 때려요",
                 "아빠가\x1e때려요", "죽고\u200b싶어"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", SERVE, str(out), json.dumps(questions)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    plain, sad, followed = json.loads(result.stdout.splitlines()[-1])
    assert plain == [tiny_bot.reply(q) for q in questions]  # the default decoding: the loop's own reply
    assert plain[-4:] == [SELF_HARM_REPLY, ABUSE_REPLY, ABUSE_REPLY, SELF_HARM_REPLY]
    assert sad == [tiny_bot.reply(q, tone="sad") for q in questions]
    said = lambda *texts: [{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)]  # noqa: E731
    assert followed == [tiny_bot.reply("응", history=history) for history in (
        said("소나기 온다", "우산 있어요?"), said("출출해"), [], said("죽고 싶어", "힘들었겠어요", "출출해"))]
    assert followed[0] == follow_up_answer("d1") and followed[2] == tiny_bot.reply("응")


def reference_cut(row: list[int], copies: int = 3) -> int:
    """`repeat_cut` for one row, written plainly: the earliest end of a phrase of 3+ tokens said twice in a row
    (keep its first copy), or a loop of a 1-8 token block run to the limit (keep its first copy); the earlier."""
    from chatbot.tokenizer.subword import END_ID, PAD_ID

    length = len(row)
    valid = next((i for i, t in enumerate(row) if t in (END_ID, PAD_ID)), length)
    cut = length
    for end in range(6, valid + 1):
        pairs = [p for p in range(3, end // 2 + 1) if row[end - 2 * p:end - p] == row[end - p:end]]
        if pairs:
            cut = end - pairs[0]
            break
    if valid == length:
        for period in range(1, 9):
            repeats = 1
            while (repeats + 1) * period <= length and \
                    row[length - (repeats + 1) * period:length - repeats * period] == row[length - period:]:
                repeats += 1
            if repeats >= copies:
                return min(cut, length - (repeats - 1) * period)
    return cut


def test_repeat_cut_says_a_repeated_phrase_once_and_cuts_a_runaway_loop():
    """One graph function (the reply graph, the SavedModel and the stream run it) against a plain reading."""
    import numpy as np
    import tensorflow as tf

    from chatbot.decoding.postprocess import repeat_cut

    length, rng = 16, np.random.default_rng(0)
    rows = [[5 + (i % 3) for i in range(length)],  # a 3-token loop
            [9] * length,  # one token, over and over
            [4, 8, *([6, 7] * 7)],  # a prefix, then a 2-token loop
            [*rng.integers(4, 50, length - 4), 2, 0, 0, 0],  # ended: nothing repeated
            [7, 7, *rng.integers(4, 50, length - 2)],  # a 1-token repeat is not a phrase
            [*rng.integers(4, 50, 10), *([11, 12, 13] * 2)],  # a phrase said twice: said once
            [20, 21, 22, 23, 20, 21, 22, 23, 2, *[0] * 7],  # a 4-token phrase twice, then the end: once
            [20, 21, 20, 21, 2, *[0] * 11],  # a 2-token pair ("네 네"): kept
            [20, 21, 22, 2, 20, 21, 22, *[0] * 9]]  # the copy after the end token: not the reply's
    rows += [list(rng.integers(4, 7, length)) for _ in range(200)]  # few tokens: repeats of every length
    rows += [[*rng.integers(4, 9, int(n)), 2, *[0] * (length - 1 - int(n))] for n in rng.integers(1, 15, 100)]
    ids = np.array(rows, np.int32)
    expected = [reference_cut(row) for row in ids.tolist()]
    assert repeat_cut(tf.constant(ids)).numpy().tolist() == expected
    assert expected[:9] == [3, 1, 4, length, length, 13, 4, length, length]


def test_tidy_says_a_stutter_once_and_keeps_the_rest_of_the_reply():
    """A block of one or two tokens that starts a word, said three or more times in a row, is said once ("수고 수고
    수고 많았어요!" -> "수고 많았어요!"), twice is kept ("네 네"), and then `repeat_cut` cuts; padding follows what is
    kept. The bundled answers hold no such stutter: tidying them changes none (tests/test_default_model.py)."""
    import numpy as np
    import tensorflow as tf

    from chatbot.decoding.postprocess import repeat_cut, tidy

    def padded(row, length=16):
        return row + [0] * (length - len(row))

    cases = [([7, 7, 7, 9, 10, 2], [7, 9, 10, 2]),  # a one-token stutter
             ([5, 6, 5, 6, 5, 6, 11, 2], [5, 6, 11, 2]),  # a two-token stutter
             ([8, 8, 9, 2], [8, 8, 9, 2]),  # said twice: kept
             ([4, 7, 7, 7, 7, 7, 12, 13, 14, 12, 13, 14, 2], [4, 7, 12, 13, 14]),  # a stutter, then a phrase twice
             ([9, 2, 9, 9, 9], [9, 2, 9, 9, 9])]  # after the end token: not the reply's, left alone
    every_word = tf.ones([64], tf.bool)  # here every piece begins a word
    ids = tf.constant([padded(row) for row, _ in cases], tf.int32)
    got = tidy(ids, every_word).numpy().tolist()
    for (row, expected), out in zip(cases, got):
        assert out == padded(expected), (row, out)
    rng = np.random.default_rng(3)
    rows = tf.constant(rng.integers(4, 7, (300, 16)), tf.int32)  # few tokens: stutters everywhere
    tidied = tidy(rows, every_word).numpy()
    for row in tidied.tolist():
        kept = [t for t in row if t != 0]
        assert all(not (kept[i] == kept[i + 1] == kept[i + 2]) for i in range(len(kept) - 2))  # no stutter left
    assert (repeat_cut(tf.constant(tidied)).numpy() == 16).all()  # and nothing left to cut
    # pieces inside a word ("바나나나", "190000", "음...") are not a stutter: only a block that starts a word is
    inside = tf.constant([padded([20, 21, 21, 21, 22, 2]), padded([23, 24, 23, 24, 23, 24, 2])], tf.int32)
    starts = tf.constant([i in (20, 22, 23) for i in range(64)])
    assert tidy(inside, starts).numpy().tolist() == [padded([20, 21, 21, 21, 22, 2]), padded([23, 24, 2])]

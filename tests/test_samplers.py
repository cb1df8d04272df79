"""The samplers keep one contract: `next(logits, scores, step, options) -> (tokens, parents, scores)`."""

import numpy as np
import pytest
import tensorflow as tf

from chatbot.config import STRATEGIES, GenerationConfig
from chatbot.decoding.request import Options
from chatbot.decoding.samplers import (NEG_INF, SAMPLERS, BeamSampler, GreedySampler, TopKTopPSampler,
                              only_padding_when_finished, sampler_for, suppress_special)
from chatbot.tokenizer.subword import END_ID, NUM_SPECIAL, PAD_ID

VOCAB = NUM_SPECIAL + 6


def options(**changes):
    values = dict(steps=10, temperature=1.0, top_k=0, top_p=1.0, repetition_penalty=1.0, length_penalty=1.0, agreement=0.0, mbr=0.0, seed=0,
                  no_repeat_ngram_size=0)
    values.update(changes)
    return Options(*(tf.constant(values[name], tf.float32 if isinstance(values[name], float) else tf.int32)
                     for name in Options._fields))


def logits_of(rows):
    """Logits (rows, VOCAB) whose favourite token in row i is rows[i]."""
    logits = np.zeros((len(rows), VOCAB), np.float32)
    for row, favourite in enumerate(rows):
        logits[row, favourite] = 4.0
    return tf.constant(logits)


def test_every_strategy_has_a_sampler():
    assert set(SAMPLERS) == set(STRATEGIES)
    for strategy in STRATEGIES:
        sampler = sampler_for(GenerationConfig(strategy=strategy, num_beams=3))
        assert sampler.num_beams == (3 if strategy == "beam" else 1)


@pytest.mark.parametrize("sampler", [GreedySampler(), TopKTopPSampler(), BeamSampler(2)], ids=type)
def test_every_sampler_returns_tokens_parents_and_scores_per_row(sampler):
    rows = [NUM_SPECIAL, NUM_SPECIAL + 1, NUM_SPECIAL + 2, NUM_SPECIAL + 3]  # two questions of two beams
    scores = tf.constant([0.0, NEG_INF, 0.0, NEG_INF])
    tokens, parents, new_scores = sampler.next(logits_of(rows), scores, tf.constant(0), options())
    assert tokens.shape == parents.shape == new_scores.shape == (4,)
    assert tokens.dtype == parents.dtype == tf.int32
    assert all(0 <= t < VOCAB for t in tokens.numpy())
    assert all(row // 2 == parent // 2 for row, parent in enumerate(parents.numpy()))  # within the question
    assert np.all(new_scores.numpy() <= scores.numpy()[parents.numpy()] + 1e-6)  # a step only adds log-probabilities


def test_greedy_takes_the_favourite_and_keeps_every_row_in_place():
    tokens, parents, scores = GreedySampler().next(logits_of([NUM_SPECIAL + 2, NUM_SPECIAL]), tf.zeros([2]),
                                                   tf.constant(1), options())
    assert tokens.numpy().tolist() == [NUM_SPECIAL + 2, NUM_SPECIAL]
    assert parents.numpy().tolist() == [0, 1]
    np.testing.assert_allclose(scores, tf.reduce_max(tf.nn.log_softmax(logits_of([NUM_SPECIAL] * 2)), -1), atol=1e-6)


def test_top_k_one_is_greedy_and_the_seed_fixes_the_draw():
    logits = tf.random.stateless_normal((8, VOCAB), seed=[1, 2])
    greedy = GreedySampler().choose(logits, tf.constant(0), options())
    assert np.array_equal(TopKTopPSampler().choose(logits, tf.constant(0), options(top_k=1, temperature=3.0)), greedy)
    draw = lambda seed: TopKTopPSampler().choose(logits, tf.constant(0), options(temperature=5.0, seed=seed))  # noqa: E731
    assert np.array_equal(draw(7), draw(7))
    assert any(not np.array_equal(draw(7), draw(seed)) for seed in range(8))


def test_a_top_p_that_rounds_to_zero_in_float32_still_picks_the_favourite():
    """Found by the Chatbot.reply property test: top_p=4e-171 passed the config's check (> 0), became
    0.0 as a float32 tensor, left no token to sample from, and the reply failed with an index of -1."""
    logits = logits_of([NUM_SPECIAL + 2, NUM_SPECIAL + 5])
    chosen = TopKTopPSampler().choose(logits, tf.constant(0), options(top_p=4e-171))
    assert chosen.numpy().tolist() == [NUM_SPECIAL + 2, NUM_SPECIAL + 5]


def test_beam_keeps_the_best_continuations_of_the_whole_group():
    # One question, two beams: beam 1 is far ahead, so both new beams continue it.
    log_probs = np.full((2, VOCAB), -10.0, np.float32)
    log_probs[1, NUM_SPECIAL], log_probs[1, NUM_SPECIAL + 1] = -0.1, -0.5
    tokens, parents, scores = BeamSampler(2).next(tf.constant(log_probs), tf.constant([-5.0, 0.0]), tf.constant(1),
                                                  options())
    assert parents.numpy().tolist() == [1, 1]
    assert tokens.numpy().tolist() == [NUM_SPECIAL, NUM_SPECIAL + 1]
    assert scores[0] >= scores[1]


def test_a_finished_row_continues_only_with_padding_at_no_cost():
    logits = only_padding_when_finished(logits_of([NUM_SPECIAL, NUM_SPECIAL]), tf.constant([True, False]))
    for sampler in (GreedySampler(), TopKTopPSampler()):
        tokens, _, scores = sampler.next(logits, tf.constant([-1.5, 0.0]), tf.constant(3), options(seed=4))
        assert int(tokens[0]) == PAD_ID and float(scores[0]) == pytest.approx(-1.5)
        assert int(tokens[1]) != PAD_ID


def test_a_reply_never_ends_before_its_first_token():
    logits = np.zeros((1, NUM_SPECIAL + 2), np.float32)
    logits[0, NUM_SPECIAL + 1], logits[0, END_ID] = 2.0, 5.0  # END is the favourite
    first = tf.argmax(suppress_special(tf.constant(logits), tf.constant(0)), axis=-1)
    later = tf.argmax(suppress_special(tf.constant(logits), tf.constant(3)), axis=-1)
    assert int(first[0]) == NUM_SPECIAL + 1
    assert int(later[0]) == END_ID


def test_top_p_draws_only_from_the_smallest_set_that_reaches_it():
    """Probabilities 0.5, 0.3, 0.2 in 512 rows drawn at once: top_p 0.4 keeps the favourite alone, 0.7 the two
    likeliest, and 1.0 (off) all three."""
    probs = np.zeros((512, VOCAB), np.float32)
    probs[:, NUM_SPECIAL:NUM_SPECIAL + 3] = [0.5, 0.3, 0.2]
    logits = tf.constant(np.log(probs + 1e-12))

    def drawn(top_p):
        return set(TopKTopPSampler().choose(logits, tf.constant(0), options(top_p=top_p, seed=3)).numpy().tolist())

    first, second, third = NUM_SPECIAL, NUM_SPECIAL + 1, NUM_SPECIAL + 2
    assert drawn(0.4) == {first}
    assert drawn(0.7) == {first, second}
    assert drawn(1.0) == {first, second, third}


def test_the_ngram_ban_is_one_graph_for_every_size_and_bans_what_a_plain_reading_bans():
    """`no_repeat_ngram_size` is a tensor of the compiled loop: one traced function serves every size (a client's
    sweep of sizes builds no new graph), and each size bans exactly the tokens that would complete an n-gram
    already written."""
    import numpy as np
    import tensorflow as tf

    from chatbot.decoding.samplers import NEG_INF, ban_repeated_ngrams

    vocab, length, rng = 9, 12, np.random.default_rng(1)
    tokens = rng.integers(3, 7, (64, length)).astype(np.int32)  # few tokens: many repeated grams
    ban = tf.function(ban_repeated_ngrams, autograph=False)
    for n in (0, 1, 2, 3, 4, length):
        for index in (0, 3, 7, length - 1):
            banned = ban(tf.zeros([64, vocab]), tf.constant(tokens), tf.constant(index), tf.constant(n)).numpy()
            for row, got in zip(tokens.tolist(), banned):
                written, expected = row[:index + 1], set()
                if n >= 2:
                    prefix = written[len(written) - (n - 1):] if len(written) >= n - 1 else None
                    for j in range(len(written) - n + 1):
                        if prefix is not None and written[j:j + n - 1] == prefix:
                            expected.add(written[j + n - 1])
                assert {t for t in range(vocab) if got[t] == NEG_INF} == expected, (n, index, written)
    assert ban.experimental_get_tracing_count() == 1

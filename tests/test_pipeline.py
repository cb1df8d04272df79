import numpy as np
import tensorflow as tf

from chatbot.training.batches import PAD_WIDTHS, make_dataset
from chatbot.tokenizer.subword import END_ID, START_ID


def ragged(rows):
    return tf.ragged.constant(rows, dtype=tf.int32)


def test_teacher_forcing_shift_and_start_end():
    data = make_dataset(ragged([[10, 11, 12]]), ragged([[20, 21]]), max_length=10, batch_size=1, shuffle=False)
    (encoder, decoder), targets = next(iter(data))
    enc, dec, tgt = (t.numpy()[0].tolist() for t in (encoder, decoder, targets))
    assert enc[:5] == [START_ID, 10, 11, 12, END_ID] and set(enc[5:]) <= {0}
    assert dec[:3] == [START_ID, 20, 21] and tgt[:3] == [20, 21, END_ID]
    assert set(dec[3:]) <= {0} and set(tgt[3:]) <= {0}


def test_long_answers_are_dropped_and_long_questions_cut():
    questions = ragged([[5] * 30, [6, 7]])
    answers = ragged([[8, 9], [9] * 30])
    batches = list(make_dataset(questions, answers, max_length=8, batch_size=4, shuffle=False))
    assert sum(int(t.shape[0]) for (_, _), t in batches) == 1
    (encoder, decoder), targets = batches[0]
    assert encoder.shape[1] <= 8 and encoder.numpy()[0, 7] == END_ID and targets.shape[1] <= 8


def test_bucketing_keeps_padding_low():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, size=400)
    rows = [[7] * int(n) for n in lengths]
    bucketed = make_dataset(ragged(rows), ragged(rows), max_length=40, batch_size=16, shuffle=False)
    padded = make_dataset(ragged(rows), ragged(rows), max_length=40, batch_size=16, shuffle=False, bucketed=False)

    def real_share(dataset):
        real = total = 0
        for (_, _), targets in dataset:
            real += int(tf.reduce_sum(tf.cast(targets != 0, tf.int32)))
            total += int(tf.size(targets))
        return real / total

    assert real_share(bucketed) > 0.8 > 0.5 > real_share(padded)


def test_bucketed_dataset_knows_its_batch_count():
    rng = np.random.default_rng(1)
    rows = [[7] * int(n) for n in rng.integers(1, 38, size=300)]
    for batch_size in (1, 7, 64, 500):
        dataset = make_dataset(ragged(rows), ragged(rows[::-1]), max_length=40, batch_size=batch_size)
        assert int(dataset.cardinality()) == len(list(dataset)) > 0


def test_each_side_is_padded_to_its_own_width_and_every_row_comes_once():
    """Encoder inputs longer than the answers (a retrieved answer read with the question): the decoder
    side is padded to the answers' lengths, not the encoder's; no row is lost or repeated."""
    rng = np.random.default_rng(2)
    questions = [[7] * int(n) for n in rng.integers(20, 38, size=300)]
    answers = [[8 + i % 50] * int(n) for i, n in enumerate(rng.integers(1, 12, size=300))]
    batches = list(make_dataset(ragged(questions), ragged(answers), max_length=40, batch_size=16))
    assert len(batches) == 19 and sum(int(targets.shape[0]) for _, targets in batches) == 300
    for (encoder, decoder), targets in batches:
        assert encoder.shape[1] in PAD_WIDTHS + (40,) and targets.shape[1] in PAD_WIDTHS
        assert decoder.shape == targets.shape and targets.shape[1] <= 15  # answers of 1-11 tokens + end
    seen = sorted(tuple(row[row != 0]) for _, targets in batches for row in targets.numpy())
    assert seen == sorted(tuple(a) + (END_ID,) for a in answers)


def test_batches_are_shuffled_between_epochs_and_the_same_for_a_seed():
    rows = [[7] * (1 + i % 30) for i in range(500)]

    def epochs(seed):
        dataset = make_dataset(ragged(rows), ragged(rows[::-1]), max_length=40, batch_size=8, seed=seed)
        return [[targets.numpy().tolist() for _, targets in dataset] for _ in range(2)]

    first, second = epochs(3)
    assert first != second and epochs(3) == [first, second] and epochs(4) != [first, second]

"""The training schedule fitted to the data's size, and the verdict on a run that did not learn."""

import dataclasses

import pytest

from chatbot.config import ChatbotConfig, DataConfig, TrainConfig
from chatbot.training.sizing import MIN_STEPS_PER_EPOCH, fitted_to_data, learning_verdict


def test_a_small_faq_gets_steps_enough_and_keeps_every_row_for_training():
    config = fitted_to_data(ChatbotConfig(), 40)
    train = config.train
    assert config.data.val_fraction == 0.0  # a held-out question of an FAQ is a fact never learned
    assert train.batch_size == 16 and train.repeats * 40 >= MIN_STEPS_PER_EPOCH * train.batch_size
    steps = train.epochs * -(-40 * train.repeats // train.batch_size)
    assert steps >= 1500 and train.warmup_steps <= steps / 4  # the learning rate peaks early in the run
    assert train.peak_learning_rate <= 5e-4  # a higher one collapsed the encoder of a small-data model


def test_large_data_keeps_the_measured_transformer_schedule():
    config = fitted_to_data(ChatbotConfig(), 28000)
    assert config.data.val_fraction == 0.1
    assert dataclasses.astuple(config.train)[:4] == (50, 64, 4000, 1)
    assert config.train.peak_learning_rate is None  # the paper's d_model^-0.5 * warmup^-0.5


def test_explicit_settings_win_and_fitting_twice_changes_nothing():
    given = ChatbotConfig(data=DataConfig(val_fraction=0.2),
                          train=TrainConfig(epochs=3, batch_size=8, warmup_steps=10, repeats=2))
    fitted = fitted_to_data(given, 40)
    assert (fitted.data.val_fraction, fitted.train.epochs, fitted.train.batch_size, fitted.train.warmup_steps,
            fitted.train.repeats) == (0.2, 3, 8, 10, 2)
    assert fitted_to_data(fitted, 40) == fitted
    assert fitted.train.peak_learning_rate is None  # an explicit warmup keeps the paper's peak


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_schedule_settings_must_be_positive_integers(value):
    with pytest.raises(ValueError, match="positive integer"):
        TrainConfig(repeats=value)


def test_a_flat_loss_or_one_reply_for_everything_is_reported():
    assert "did not learn" in learning_verdict([{"loss": "4.9"}, {"loss": "4.8"}])
    assert "one reply" in learning_verdict([{"loss": "4.9", "val_unique": "0.05"}, {"loss": "1.0", "val_unique": "0.1"}])
    assert learning_verdict([{"loss": "4.9", "val_unique": "0.3"}, {"loss": "1.2", "val_unique": "0.9"}]) == ""
    assert learning_verdict([]) == ""
    assert "one reply" in learning_verdict([{"loss": "5.0"}, {"loss": "0.1"}], replies=1, answers=26)  # collapsed
    assert learning_verdict([{"loss": "5.0"}, {"loss": "0.1"}], replies=26, answers=26) == ""


def test_early_stopping_is_fitted_to_the_run_and_a_given_patience_wins():
    from chatbot.config import ChatbotConfig, DataConfig, TrainConfig
    from chatbot.training.sizing import MIN_PATIENCE, PATIENCE_STEPS, fitted_to_data

    # about PATIENCE_STEPS steps: the default recipe's 502 steps an epoch wait 2 epochs, 6,290 pairs' 89 wait 7
    assert PATIENCE_STEPS == 600
    assert fitted_to_data(ChatbotConfig(train=TrainConfig(epochs=30)), 35729).train.early_stopping == MIN_PATIENCE
    assert fitted_to_data(ChatbotConfig(train=TrainConfig(epochs=80)), 35729).train.early_stopping == MIN_PATIENCE
    assert fitted_to_data(ChatbotConfig(), 6290).train.early_stopping == 7
    assert fitted_to_data(ChatbotConfig(train=TrainConfig(epochs=12)), 6290).train.early_stopping == 12 // 4  # at most
    assert fitted_to_data(ChatbotConfig(), 40).train.early_stopping == 0  # no held-out questions: every epoch counts
    assert fitted_to_data(ChatbotConfig(data=DataConfig(val_fraction=0.2)), 40).train.early_stopping == 40 // 4
    assert fitted_to_data(ChatbotConfig(train=TrainConfig(early_stopping=0)), 27760).train.early_stopping == 0
    assert fitted_to_data(ChatbotConfig(train=TrainConfig(early_stopping=2)), 27760).train.early_stopping == 2

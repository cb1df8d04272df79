"""The training schedule chosen from the size of the data, and the verdict on whether a run learned.

Owns: `fitted_to_data`, the one rule that fills every training setting left unset (`None`): batch size,
how often each pair repeats within an epoch, epochs, warmup, peak learning rate, the validation share and
the patience of early stopping (`WHEN_UNSET` says it in words, for the CLI's help).
The CLI, the Python API and the web app's retrain tab all leave these unset unless the user sets them, so
one file trains the same way from each. Also `learning_verdict`, the one-line warning for a run that did not
learn. Must not import TensorFlow.

Why a rule: the transformer schedule (4,000 warmup steps) suits ten thousand pairs at 64 a batch, but on a
40-row FAQ an epoch is one step, and 50 epochs never leave the warmup.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

from chatbot.config import VAL_FRACTION, ChatbotConfig

MIN_STEPS_PER_EPOCH = 50  # small data repeats within an epoch, so epochs (and their checkpoints) stay few
SMALL_DATA_PAIRS = 1000  # below this every pair trains: a held-out question of an FAQ is a fact never learned
FULL_WARMUP_STEPS = 4000  # the paper's warmup, measured best on ChatbotData (BENCHMARKS.md)
# On a 40-row FAQ a 1.4e-3 peak (the full schedule's) made the encoder collapse: one reply for every question,
# at 95% teacher-forced accuracy; 5e-4 answered every training question with its own answer (BENCHMARKS.md).
SHORT_RUN_PEAK = 5e-4
BASE_EPOCHS, BASE_PEAK = 8, 2e-4  # a model built on a trained one: measured with bench/small_csv.py
NOT_LEARNED_LOSS_SHARE = 0.75  # a last epoch's loss above this share of the first epoch's: it did not learn
# The default recipe's replies peaked at epoch 8 of 30 and never came back: the 22 epochs after bought nothing.
# Early stopping waits about PATIENCE_STEPS optimizer steps without a better --select score, in whole epochs:
# at least MIN_PATIENCE (chrF of 800 replies is noisy), at most a quarter of the epochs. A large data set's
# epoch is many steps, so it waits fewer epochs (the default recipe: 2, about 1,000 steps).
PATIENCE_STEPS = 600
MIN_PATIENCE = 2
ONE_REPLY_SHARE = 0.2  # distinct validation replies below this share: one sentence for everything
# What `fitted_to_data` chooses for a setting left unset, in words (the CLI's help says it).
WHEN_UNSET = {
    "epochs": "50 for 2,000 pairs or more, else 40",
    "batch_size": "16, 32 or 64",
    "repeats": f"at least {MIN_STEPS_PER_EPOCH} steps an epoch",
    "warmup_steps": f"{FULL_WARMUP_STEPS:,}, or a fifth of a shorter run",
    "val_fraction": f"{VAL_FRACTION}, or 0 under {SMALL_DATA_PAIRS:,} pairs",
    "early_stopping": f"about {PATIENCE_STEPS:,} steps in epochs (at least {MIN_PATIENCE}, at most a quarter of the "
                      f"epochs) when questions are held out; else off",
}


def fitted_to_data(config: ChatbotConfig, pairs: int, built_on_base: bool = False) -> ChatbotConfig:
    """`config` with every unset training setting chosen for `pairs` training pairs (explicit ones kept). A model
    built on a trained one (`built_on_base`) already writes out the answers it retrieves: it learns the new pairs
    in BASE_EPOCHS epochs at a gentle BASE_PEAK, warming up for a fifth of them."""
    data, train = config.data, config.train
    if built_on_base:
        train = dataclasses.replace(train, epochs=train.epochs or BASE_EPOCHS,
                                    peak_learning_rate=train.peak_learning_rate or BASE_PEAK)
    val_fraction = data.val_fraction if data.val_fraction is not None else (VAL_FRACTION if pairs >= SMALL_DATA_PAIRS else 0.0)
    train_pairs = max(1, round(pairs * (1 - val_fraction)))
    batch_size = train.batch_size or (64 if train_pairs >= 2000 else 32 if train_pairs >= 500 else 16)
    repeats = train.repeats or max(1, math.ceil(MIN_STEPS_PER_EPOCH * batch_size / train_pairs))
    epochs = train.epochs or (50 if train_pairs >= 2000 else 40)
    steps_per_epoch = math.ceil(train_pairs * repeats / batch_size)
    total_steps = epochs * steps_per_epoch
    warmup = train.warmup_steps or (FULL_WARMUP_STEPS if total_steps >= 2.5 * FULL_WARMUP_STEPS
                                    else max(50, total_steps // 5))
    peak = train.peak_learning_rate
    if peak is None and not train.warmup_steps and warmup < FULL_WARMUP_STEPS:  # a short warmup chosen here
        # must not raise the peak (a warmup given explicitly keeps the paper's d_model^-0.5 * warmup^-0.5)
        peak = min(SHORT_RUN_PEAK, config.model.d_model ** -0.5 * FULL_WARMUP_STEPS ** -0.5)
    fitted = min(max(MIN_PATIENCE, math.ceil(PATIENCE_STEPS / steps_per_epoch)), max(MIN_PATIENCE, epochs // 4))
    patience = train.early_stopping if train.early_stopping is not None else (
        fitted if val_fraction else 0)  # without held-out questions: every epoch counts
    return dataclasses.replace(
        config, data=dataclasses.replace(data, val_fraction=val_fraction),
        train=dataclasses.replace(train, batch_size=batch_size, repeats=repeats, epochs=epochs, warmup_steps=warmup,
                                  peak_learning_rate=peak, early_stopping=patience))


def learning_verdict(history: list[dict], replies: int | None = None, answers: int | None = None) -> str:
    """"" when the epochs in `history` (rows of `loss` and maybe `val_unique`) and the model's own replies to
    training questions (`replies` distinct ones where the data has `answers` distinct answers) show learning;
    else one line saying what went wrong and what to try."""
    losses = [float(row["loss"]) for row in history if row.get("loss") not in (None, "")]
    if len(losses) >= 2 and losses[-1] > NOT_LEARNED_LOSS_SHARE * losses[0]:
        return (f"the model did not learn: training loss {losses[0]:.2f} -> {losses[-1]:.2f}; try more --epochs, "
                f"or leave --batch-size and --warmup-steps unset so they fit the data")
    unique = [float(row["val_unique"]) for row in history if row.get("val_unique") not in (None, "")]
    if unique and max(unique) < ONE_REPLY_SHARE:
        return (f"the model gives nearly one reply for everything: at most {max(unique):.0%} distinct replies to "
                f"the validation questions; try more data or more --epochs")
    if replies is not None and answers and replies < ONE_REPLY_SHARE * answers:
        return (f"the model gives nearly one reply for everything: {replies} distinct replies to training questions "
                f"with {answers} distinct answers; try a lower --peak-learning-rate or more data")
    return ""


def read_history(path: Path) -> list[dict]:
    """The epochs' rows of a run's history.csv (none if it has none)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as file:
        return list(csv.DictReader(file))

"""Choosing what training keeps: the epoch whose replies are best, and the rerank weights.

Owns: which validation questions those choices are made on (`validation_sample`, and `unsampled`, the
ones none of them saw), `selection_score` and `ReplyQualityCheckpoint`, the Keras callback that scores
decoded validation replies every epoch so training can keep the epoch whose replies are best, and
`fit_rerank_weights` / `fit_rerank`, which choose a model's rerank weights on the same questions (when there
are enough of them).
Must not train, and must not define metrics (those are `chatbot.training.evaluate`'s).
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import keras
import numpy as np
import sacrebleu

from chatbot.training.evaluate import replies_to, reply_metrics


MIN_UNIQUE = 0.5  # below this share of distinct replies an epoch is "collapsed" and is not kept for its chrF


def sampled_positions(count: int, max_questions: int = 500) -> range:
    """Positions of at most `max_questions` of `count` pairs, evenly spread."""
    return range(0, count, max(1, count // max_questions))[:max_questions]


def validation_sample(pairs: list, max_questions: int = 500) -> list:
    """The pairs at `sampled_positions`: what epoch selection and rerank fitting ask."""
    return [pairs[i] for i in sampled_positions(len(pairs), max_questions)]


def unsampled(pairs: list, max_questions: int = 500) -> list:
    """The pairs `validation_sample` leaves out: validation questions that no choice of training (the
    epoch kept, the rerank weights) was made on, for scores none of those choices saw."""
    asked = set(sampled_positions(len(pairs), max_questions))
    return [pair for i, pair in enumerate(pairs) if i not in asked]


# The rerank weights `fit_rerank_weights` tries: (similarity, consensus, likelihood).
RERANK_GRID = [(similarity, consensus, likelihood) for similarity in (1, 4, 16, 64)
               for consensus in (0, 1, 2, 4, 8, 16, 32) for likelihood in (0, 0.125, 0.25, 0.5, 1, 2)]


RERANK_FIT_CANDIDATES = 8  # retrieved answers weighed when the rerank weights are fitted (`candidates`' usual count)


def fit_rerank_weights(bot, questions: list[str], references: list[str], batch_size: int = 64):
    """The `RerankConfig` whose replies to these (validation) questions score the best chrF against their
    references, and that chrF: among the defaults and RERANK_GRID, the defaults unless a grid point does
    strictly better. Each question's candidates (its greedy reply and `RERANK_FIT_CANDIDATES` retrieved
    answers: the weights are for the `candidates` option, whatever the decoding default) and their features
    are computed once; only the weighted choice is tried per grid point."""
    import tensorflow as tf

    from chatbot.config import RerankConfig
    from chatbot.decoding.rerank import Features, choice

    options = bot.options(bot.check())
    run = tf.function(lambda texts: reply_features(bot, texts, options, RERANK_FIT_CANDIDATES), autograph=False,
                      input_signature=[tf.TensorSpec([None], tf.string)])  # one trace, whatever the last batch's size
    parts = [run(tf.constant(questions[i:i + batch_size])) for i in range(0, len(questions), batch_size)]
    found = Features(*(tf.concat(column, axis=0) for column in zip(*parts)))
    rows, count, length = found.candidates.shape
    texts = bot.tokenizer.detokenize(tf.reshape(found.candidates, [-1, length])).numpy().reshape(rows, count)

    scores = {}  # many weights choose alike: chrF once per distinct choice

    def score(weights) -> float:
        picked = choice(found, weights).numpy()
        if (key := picked.tobytes()) not in scores:
            chosen = texts[np.arange(rows), picked]
            scores[key] = sacrebleu.corpus_chrf([text.decode("utf-8") for text in chosen], [references]).score
        return scores[key]

    best, best_score = RerankConfig(), score(RerankConfig())
    for similarity, consensus, likelihood in RERANK_GRID:
        weights = RerankConfig(likelihood=likelihood, similarity=similarity, consensus=consensus)
        if (candidate_score := score(weights)) > best_score:
            best, best_score = weights, candidate_score
    return dataclasses.replace(best, fitted_on=len(questions)), best_score


def reply_features(bot, texts, options, count: int):
    """`chatbot.decoding.rerank.Features` of each question's greedy reply and `count` retrieved answers (no tone asked),
    in the graph: the engine's stages up to the rerank's choice, which fitting the weights tries."""
    from chatbot.config import GenerationConfig

    plan, loop = bot.plan(GenerationConfig(candidates=count), jit=False), bot.generator.loop
    prepared = bot.prepare(texts, None, plan.candidates)
    cross_cache = loop.encode(prepared.encoder_ids)
    return loop.features(prepared, cross_cache, loop.run(prepared.encoder_ids, cross_cache, options, plan), options)


def selection_score(chrf: float, unique_ratio: float) -> float:
    """What `ReplyQualityCheckpoint` maximises: chrF among epochs whose replies are varied, and
    below every such epoch (ranked by variety) the collapsed ones. One reply for every question
    can score a fair chrF on this data (a common answer shares many characters with most answers)."""
    return chrf if unique_ratio >= MIN_UNIQUE else unique_ratio - 1.0


class ReplyQualityCheckpoint(keras.callbacks.Callback):
    """After every epoch, answer up to `max_questions` validation questions with the greedy replies of
    the model being trained (its own, not weighed against retrieved answers: those change little from
    epoch to epoch and would hide what does), add `val_chrf`, `val_unique` and `val_select` (see
    `selection_score`) to the epoch's logs, and save the weights to `weights_path` when `val_select` is
    the best so far (above `best`, for a resumed run).

    Validation loss alone picks the wrong epoch: its minimum often comes with a handful of generic
    replies for every question, while the replies keep getting better for many epochs after it."""

    def __init__(self, bot, pairs, weights_path: str | Path, max_questions: int = 500, best: float | None = None):
        super().__init__()
        sample = validation_sample(pairs, max_questions)
        self.bot, self.weights_path = bot, str(weights_path)
        self.questions, self.references = [p.question for p in sample], [p.answer for p in sample]
        self.best = -math.inf if best is None else best

    def on_epoch_end(self, epoch, logs=None):
        scores = reply_metrics(replies_to(self.bot, self.questions, candidates=0), self.references)
        score = selection_score(scores["chrf"], scores["unique_ratio"])
        if logs is not None:
            logs.update(val_chrf=scores["chrf"], val_unique=scores["unique_ratio"], val_select=score)
        if score > self.best:
            self.best = score
            self.model.save_weights(self.weights_path)


MIN_RERANK_FIT = 100  # validation questions below which `fit_rerank` keeps the default weights


def fit_rerank(bot, val_pairs, log=print):
    """`fit_rerank_weights` for a freshly trained `bot` on a sample of its validation pairs (retrieving from
    the training pairs only, as in training), logged. With fewer than `MIN_RERANK_FIT` distinct questions,
    `bot`'s own weights (the defaults, fitted on a full run) are kept: the best of the grid's weightings on a
    few questions is mostly chance, and fitting would cost seconds of tracing for it."""
    sample = validation_sample(val_pairs)
    if (distinct := len({p.question for p in sample})) < MIN_RERANK_FIT:
        log(f"reranking weights: the defaults, as {distinct} validation questions are too few to fit them on "
            f"(at least {MIN_RERANK_FIT})")
        return bot.config.rerank
    weights, chrf = fit_rerank_weights(bot, [p.question for p in sample], [p.answer for p in sample])
    log(f"reranking weights fitted on {len(sample)} validation questions: likelihood {weights.likelihood:g}, "
        f"retrieval score {weights.similarity:g}, consensus {weights.consensus:g} (validation chrF {chrf:.2f})")
    return weights

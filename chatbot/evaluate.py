"""Measuring a model on held-out pairs: what a user sees (the replies) and what the loss sees.

Owns: reply metrics (chrF, character-level BLEU, exact match, unique-reply ratio, distinct-n,
reply length), teacher-forced metrics (masked loss, perplexity, token accuracy), per-reply
latency, `evaluate()` that gathers them into one dict, `ReplyQualityCheckpoint`, the Keras
callback that scores decoded validation replies every epoch so training can keep the epoch whose
replies are best, and `fit_rerank_weights`, which chooses a model's rerank weights the same way
(from `reply_features`).
Must not train.

chrF and BLEU come from sacrebleu. Korean has no reliable word boundaries, so BLEU is computed over
characters (sacrebleu's `char` tokenizer) and named `bleu_char`. distinct-n counts n-grams of
space-separated words (어절) over all replies.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from pathlib import Path

import keras
import numpy as np
import sacrebleu


def distinct_n(replies: list[str], n: int) -> float:
    """Distinct n-grams of space-separated words over all replies, divided by all n-grams."""
    grams = Counter()
    for reply in replies:
        words = reply.split()
        grams.update(tuple(words[i:i + n]) for i in range(len(words) - n + 1))
    total = sum(grams.values())
    return len(grams) / total if total else 0.0


def reply_metrics(replies: list[str], references: list[str]) -> dict:
    """Scores of replies against one reference answer each."""
    if len(replies) != len(references):
        raise ValueError(f"{len(replies)} replies for {len(references)} references")
    if not replies:
        raise ValueError("nothing to score")
    return {
        "chrf": sacrebleu.corpus_chrf(replies, [references]).score,
        "bleu_char": sacrebleu.corpus_bleu(replies, [references], tokenize="char").score,
        "exact_match": sum(r == a for r, a in zip(replies, references)) / len(replies),
        "unique_ratio": len(set(replies)) / len(replies),
        "distinct_1": distinct_n(replies, 1),
        "distinct_2": distinct_n(replies, 2),
        "mean_reply_chars": float(np.mean([len(r) for r in replies])),
    }


def replies_to(bot, questions: list[str], batch_size: int = 128, **decoding) -> list[str]:
    """`bot.reply_batch` over any number of questions, `batch_size` at a time."""
    replies = []
    for start in range(0, len(questions), batch_size):
        replies += bot.reply_batch(questions[start:start + batch_size], **decoding)
    return replies


def teacher_forced_metrics(bot, pairs, batch_size: int = 64) -> dict:
    """Masked cross-entropy (nats per real answer token), perplexity and token accuracy."""
    import tensorflow as tf

    from chatbot.pipeline import make_dataset

    tokenizer = bot.tokenizer
    questions = [p.question for p in pairs]
    data = make_dataset(tokenizer.tokenize(questions), tokenizer.tokenize([p.answer for p in pairs]),
                        max_length=bot.model.max_length, batch_size=batch_size, shuffle=False,
                        encoder_ids=bot.decoder.encoder_ids(tf.constant(questions)))  # with retrieved answers

    @tf.function(reduce_retracing=True, autograph=False)
    def sums(inputs, targets):
        logits = tf.cast(bot.model(inputs, training=False), tf.float32)
        mask = tf.cast(targets != 0, tf.float32)
        loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        hits = tf.cast(tf.argmax(logits, -1, output_type=targets.dtype) == targets, tf.float32)
        return tf.reduce_sum(loss * mask), tf.reduce_sum(hits * mask), tf.reduce_sum(mask)

    loss = hits = tokens = 0.0
    for inputs, targets in data:
        batch_loss, batch_hits, batch_tokens = sums(inputs, targets)
        loss, hits, tokens = loss + float(batch_loss), hits + float(batch_hits), tokens + float(batch_tokens)
    if not tokens:
        return {"loss": None, "perplexity": None, "token_accuracy": None}
    return {"loss": loss / tokens, "perplexity": math.exp(min(loss / tokens, 50.0)), "token_accuracy": hits / tokens}


def latency_ms(bot, questions: list[str], **decoding) -> dict:
    """Milliseconds per reply, one question at a time (after one untimed call that compiles)."""
    bot.reply(questions[0], **decoding)
    times = []
    for question in questions:
        start = time.perf_counter()
        bot.reply(question, **decoding)
        times.append((time.perf_counter() - start) * 1000)
    return {"ms_per_reply_p50": float(np.percentile(times, 50)), "ms_per_reply_p95": float(np.percentile(times, 95))}


def evaluate(bot, pairs, *, batch_size: int = 64, latency_sample: int = 50, replies_out: str | Path | None = None,
             **decoding) -> dict:
    """Every metric of `bot` on `pairs` (questions it should not have seen), as one flat dict."""
    questions, references = [p.question for p in pairs], [p.answer for p in pairs]
    replies = replies_to(bot, questions, batch_size, **decoding)
    result = {"n": len(pairs), **teacher_forced_metrics(bot, pairs, batch_size), **reply_metrics(replies, references)}
    if latency_sample:
        result.update(latency_ms(bot, questions[:latency_sample], **decoding))
    if replies_out is not None:
        write_replies(replies_out, questions, references, replies)
    return result


def write_replies(path: str | Path, questions, references, replies) -> None:
    """A `Q,A,reply` CSV, written atomically."""
    import csv
    import io

    from chatbot.artifacts import atomic_write_bytes

    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(("Q", "A", "reply"))
    writer.writerows(zip(questions, references, replies))
    atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))


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
    from chatbot.rerank import Features, choice

    _, options = bot.options()
    run = tf.function(lambda texts: reply_features(bot.decoder, texts, options, RERANK_FIT_CANDIDATES), autograph=False,
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


def reply_features(decoder, texts, options, count: int):
    """`chatbot.rerank.Features` of each question's greedy reply and `count` retrieved answers (no tone asked),
    in the graph: the decoding room's stages up to the rerank's choice, which fitting the weights tries."""
    from chatbot.config import GenerationConfig
    from chatbot.rerank import features

    plan = decoder.plan(GenerationConfig(candidates=count), jit=False)
    prepared = decoder.prepare(texts, None, plan)
    cross_cache = decoder.encode(prepared.encoder_ids)
    replies = decoder.run(prepared.encoder_ids, cross_cache, options, plan)
    return features(decoder.model, prepared.encoder_ids, cross_cache, replies, prepared.retrieved, prepared.scores,
                    options.steps)


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


def fit_rerank(bot, val_pairs, log=print):
    """`fit_rerank_weights` for a freshly trained `bot` on a sample of its validation pairs (retrieving from
    the training pairs only, as in training), logged."""
    sample = validation_sample(val_pairs)
    weights, chrf = fit_rerank_weights(bot, [p.question for p in sample], [p.answer for p in sample])
    log(f"reranking weights fitted on {len(sample)} validation questions: likelihood {weights.likelihood:g}, "
        f"retrieval score {weights.similarity:g}, consensus {weights.consensus:g} (validation chrF {chrf:.2f})")
    return weights


def reply_variety(bot, pairs, count: int = 64) -> tuple[int, int]:
    """(distinct replies the model writes itself, distinct answers) for the first `count` of `pairs`: a model
    whose encoder collapsed gives one reply for all, however low its teacher-forced loss."""
    sample = pairs[:count]
    replies = bot.reply_batch([p.question for p in sample], candidates=0) if sample else []
    return len(set(replies)), len({p.answer for p in sample})

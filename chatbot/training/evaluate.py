"""Measuring a model on held-out pairs: what a user sees (the replies) and what the loss sees.

Owns: reply metrics (chrF, character-level BLEU, exact match, unique-reply ratio, distinct-n,
reply length), teacher-forced metrics (masked loss, perplexity, token accuracy), per-reply
latency, `evaluate()` that gathers them into one dict, and `reply_variety`, how many distinct
replies a model writes itself (the sign of a collapsed encoder).
Must not train, nor choose what training keeps (the epoch, the rerank weights: `chatbot.training.best_epoch`).

chrF and BLEU come from sacrebleu. Korean has no reliable word boundaries, so BLEU is computed over
characters (sacrebleu's `char` tokenizer) and named `bleu_char`. distinct-n counts n-grams of
space-separated words (어절) over all replies.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

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

    from chatbot.training.batches import make_dataset

    tokenizer = bot.tokenizer
    questions = [p.question for p in pairs]
    data = make_dataset(tokenizer.tokenize(questions), tokenizer.tokenize([p.answer for p in pairs]),
                        max_length=bot.model.max_length, batch_size=batch_size, shuffle=False,
                        encoder_ids=bot.encoder_ids(tf.constant(questions)))  # with retrieved answers

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


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")  # a spreadsheet reads a cell that starts so as a formula


def spreadsheet_safe(cell: str) -> str:
    """`cell` as OWASP's CSV-injection guidance writes it: one that a spreadsheet would run as a formula
    (`=cmd|' /C calc'!A0`, learned from training data) gets a leading apostrophe, so it shows as text."""
    return "'" + cell if cell.startswith(FORMULA_STARTS) else cell


def write_replies(path: str | Path, questions, references, replies) -> None:
    """A `Q,A,reply` CSV, written atomically, every field quoted and no cell a spreadsheet formula."""
    import csv
    import io

    from chatbot.files import atomic_write_bytes

    buffer = io.StringIO()
    writer = csv.writer(buffer, quoting=csv.QUOTE_ALL)
    writer.writerow(("Q", "A", "reply"))
    writer.writerows([tuple(map(spreadsheet_safe, row)) for row in zip(questions, references, replies)])
    atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))


def reply_variety(bot, pairs, count: int = 64) -> tuple[int, int]:
    """(distinct replies the model writes itself, distinct answers) for the first `count` of `pairs`: a model
    whose encoder collapsed gives one reply for all, however low its teacher-forced loss."""
    sample = pairs[:count]
    replies = bot.reply_batch([p.question for p in sample], candidates=0) if sample else []
    return len(set(replies)), len({p.answer for p in sample})

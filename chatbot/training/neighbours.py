"""What the encoder reads besides the question, for training: tones and retrieved neighbours.

Owns: each training pair's tone token (with its dropout), its retrieved neighbours (leave-one-out:
never a row with its own question), the share of pairs that see an answer worth copying among them
(`ContextConfig.gold_rate`: their own answer, or with neighbours' questions shown, a neighbour answering
alike), the encoder length they need, and the batches that carry them. Decoding composes the same encoder
input in the graph (`chatbot.decoding.prepare`); both go through `chatbot.model.inputs.compose_encoder_inputs`.
"""

from __future__ import annotations

import dataclasses
import random

import tensorflow as tf

from chatbot.config import CONTEXT_TURNS, ChatbotConfig
from chatbot.data.pairs import QAPair
from chatbot.model.inputs import compose_encoder_inputs
from chatbot.training.batches import fits, make_dataset
from chatbot.retrieval.retriever import NO_TONE, char_bigrams
from chatbot.data.text import TURN

# How many of a training question's nearest neighbours the gold-biased swap chooses from: near enough
# in question that inference could retrieve them, many enough that one often answers alike.
GOLD_POOL = 10
# A neighbour's answer at least this alike (`answer_likeness`) to the pair's own counts as answering alike:
# below it, shared endings such as "세요" are most of the overlap.
ALIKE = 0.5
NOISE_RATE = 0.3  # share of a question's characters dropped to stand for a paraphrase (`noised`)


def tones_of(pairs: list[QAPair], config: ChatbotConfig, dropout: float) -> list[int]:
    """Each pair's tone for its encoder input: its label, or NO_TONE for a `dropout` share of them
    (seeded), so the model also learns to answer when no tone is asked."""
    if not config.context.tone:
        return [NO_TONE] * len(pairs)
    rng = random.Random(config.train.seed)
    return [NO_TONE if p.label is None or rng.random() < dropout else p.label for p in pairs]


def answer_likeness(a: str, b: str) -> float:
    """Dice overlap of two answers' character bigrams, in [0, 1] (1 for the same text)."""
    grams_a, grams_b = set(char_bigrams(a)), set(char_bigrams(b))
    if not grams_a or not grams_b:
        return float(a == b)
    return 2 * len(grams_a & grams_b) / (len(grams_a) + len(grams_b))


def noised(text: str, rng: random.Random) -> str:
    """`text` with each character but spaces dropped at NOISE_RATE (seeded by `rng`), and always at least
    one when the text has two: a stand-in for another way of asking the same thing (spaces tidied)."""
    kept = "".join(c for c in text if c in (" ", TURN) or rng.random() >= NOISE_RATE)
    if kept == text and len(text.replace(" ", "")) > 1:  # always a different text, when one can be made
        at = rng.choice([i for i, c in enumerate(text) if c != " "])
        kept = text[:at] + text[at + 1:]
    return TURN.join(" ".join(word for word in part.split(" ") if word) for part in kept.split(TURN)) or text[:1]


def with_own_answer(pairs: list[QAPair], found: list[list[QAPair]], gold_rate: float,
                    seed: int) -> list[list[QAPair]]:
    """For the answers-only layout: for a `gold_rate` share of the pairs (seeded), the pair itself takes a
    random slot of its neighbours, unless its answer is there already (Retrieve and Refine)."""
    rng = random.Random(seed)
    mixed = []
    for pair, row in zip(pairs, found):
        row = list(row)
        if rng.random() < gold_rate and pair.answer not in [n.answer for n in row]:
            row[rng.randrange(len(row))] = pair
        mixed.append(row)
    return mixed


def with_gold_biased(pairs: list[QAPair], pools: list[list[QAPair]], k: int, gold_rate: float,
                     seed: int) -> list[list[QAPair]]:
    """Each pair's `k` nearest neighbours (`pools` holds more, nearest first); for a `gold_rate` share of
    the pairs (seeded), one random slot gets a neighbour that answers as the pair does: the pool's
    neighbour whose answer is most like the pair's own if that one is alike (`ALIKE`), else the pair
    itself with its question noised (`noised`), so that even data in which no two answers are alike (a
    small FAQ) shows answers worth copying, never under the asked question's exact text. Retrieve and
    Refine's gold-biased candidates, shown with their questions. Measured on the default data
    (BENCHMARKS.md), the model learned to copy only under a noised copy of the asked question, which
    real neighbours never are: its own replies got worse."""
    rng = random.Random(seed)
    chosen = []
    for pair, pool in zip(pairs, pools):
        nearest = list(pool[:k])
        if nearest and rng.random() < gold_rate:
            likeness = [answer_likeness(n.answer, pair.answer) for n in pool]
            best = max(range(len(pool)), key=likeness.__getitem__)
            swap = pool[best] if likeness[best] >= ALIKE else QAPair(noised(pair.question, rng), pair.answer)
            if swap not in nearest:
                nearest[rng.randrange(len(nearest))] = swap
        chosen.append(nearest)
    return chosen


def training_batches(tokenizer, pairs, config: ChatbotConfig, shuffle, retriever=None, leave_one_out=False,
                     replicas=1, progress=None):
    """Batches of `pairs`, their encoder inputs composed as decoding composes them (tone, retrieved
    neighbours); training questions retrieve leave-one-out, then get gold-biased neighbours
    (`with_gold_biased`). `progress`: the leave-one-out's (`Retriever.leave_one_out`). Returns the batches and
    how many answers were too long to train on."""
    answers = tokenizer.tokenize([p.answer for p in pairs])
    k = config.context.retrieved
    tones = tones_of(pairs, config, config.context.tone_dropout if shuffle else 1.0)
    neighbour_answers = neighbour_questions = None
    if k:
        if leave_one_out and config.context.questions:
            pools = retriever.leave_one_out(pairs, max(k, GOLD_POOL), tones, progress=progress)
            found = with_gold_biased(pairs, pools, k, config.context.gold_rate, config.train.seed + 1)
        elif leave_one_out:
            found = with_own_answer(pairs, retriever.leave_one_out(pairs, k, tones, progress=progress),
                                    config.context.gold_rate, config.train.seed + 1)
        else:
            asked, given = retriever.neighbours([p.question for p in pairs], k, tones)
            found = [[QAPair(q.decode("utf-8"), a.decode("utf-8")) for q, a in zip(*row)]
                     for row in zip(asked.numpy(), given.numpy())]
        neighbour_answers = tf.constant([[n.answer for n in row] for row in found])
        neighbour_questions = tf.constant([[n.question for n in row] for row in found])
    encoder = compose_encoder_inputs(tokenizer.tokenize, tf.constant([p.question for p in pairs]), tones, config,
                                     neighbour_answers, neighbour_questions)
    dataset = make_dataset(None, answers, max_length=config.model.max_length, batch_size=config.train.batch_size,
                           shuffle=shuffle, seed=config.train.seed, encoder_ids=encoder, replicas=replicas)
    return dataset, int((~fits(answers, config.model.max_length)).sum())


def context_for(config: ChatbotConfig, pairs: list[QAPair]) -> ChatbotConfig:
    """The config with what the encoder reads settled by the data: tones only if the data has labels, the
    conversation before a message only if the data has dialogues, and room in the encoder for the tone token,
    those messages and the retrieved neighbours."""
    context = dataclasses.replace(config.context, tone=config.context.tone and any(p.label is not None for p in pairs),
                                  turns=CONTEXT_TURNS if any(TURN in p.question for p in pairs) else 0)
    per_neighbour = config.model.max_length * (2 if context.questions else 1)
    per_turn = config.model.max_length // 2 + 2
    extra = per_neighbour * context.retrieved + int(context.tone) + per_turn * context.turns
    encoder_length = config.model.max_length + extra if extra else 0
    return dataclasses.replace(config, context=context,
                               model=dataclasses.replace(config.model, encoder_length=encoder_length))

"""Retrieval levers for a FAQ model built on multilingual-e5-small, measured on the two example FAQs.

Each FAQ (data/examples/<name>.csv) is the index; its paraphrases (<name>_paraphrases.csv) ask and are right when
the top answer is the expected one; its out-of-scope questions (<name>_out_of_scope.csv) should get the fallback.
These files are a DEV set: the levers and their settings below were chosen looking at them, so the numbers are
optimistic for any other FAQ. `--noise` adds the same rows for the best levers on a seeded, held-out wording
noise of the same files (spacing, punctuation, one-jamo typos, casual endings), chosen after the levers were.

Columns (each "shop / library"):
- paraphrases right: top-1 answer == the expected one (whatever the fallback);
- calibrated as `train` does (`retrieval.calibrated_threshold`: 5% quantile of each training question's best
  score over the other rows, own text left out, among questions whose answer has other questions): share of
  out-of-scope questions and of paraphrases that fall back. With answer documents, the "other rows" of an answer
  still carry its document, which contains the question's own text: that calibration is high;
- "LOO calib": the same with each question scored against its own answer's document built WITHOUT it
  (leave-one-out docs) and, for projections, with a W trained without it (5-fold cross-fitting): each question
  asks as a new wording would;
- out-of-scope fallback at the threshold where 10% of paraphrases fall back; the best balanced accuracy of
  paraphrases kept against out-of-scope turned away (any threshold);
- training questions right: top-1 answer right and not below the train-calibrated threshold.

Levers: e5 answer documents ("query: " both sides, today's); mean/max of the best training-question cosine and
the document cosine; e5 fused with the character TF-IDF over answer documents (e5 rescaled first); a linear
projection W (384x384 from identity, or identity + low rank) on message and document vectors, trained at build
time on the FAQ (InfoNCE, each training question against every answer's document, its own answer's built without
it) with and without an L2 pull toward identity; the same projection trained on the bundled everyday data's
situations (a general adapter); "passage: " documents; and character re-scoring of e5's top answers.

Every embedding is cached in --cache (np.save), so a rerun embeds nothing.

    python bench/faq_levers.py [--cache DIR] [--noise] [--quick] [--pull 0.01] [--rate 1e-3]

About 6 minutes on 2 shared cores with an empty cache (e5 embeds about 4,000 texts, 2,600 of them the everyday
data's), 5 minutes cached (the projections train 6 times each: once to serve, 5 folds to calibrate).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import unicodedata
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from common import ROOT

from chatbot.data.text import normalize, one_text

EXAMPLES = ROOT / "data" / "examples"
QUERY, PASSAGE = "query: ", "passage: "


# ------------------------------------------------------------------------------------------------ embeddings


class Store:
    """e5 unit vectors of (prefix, text), kept in DIR/vectors.npy + DIR/keys.json; each embedded once."""

    def __init__(self, directory: str):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.keys, self.vectors = [], np.zeros((0, 384), np.float32)
        if (self.dir / "keys.json").is_file():
            self.keys = json.loads((self.dir / "keys.json").read_text(encoding="utf-8"))
            self.vectors = np.load(self.dir / "vectors.npy")
        self.where = {tuple(k): i for i, k in enumerate(self.keys)}
        self.encoder = self.tokenizer = None
        self.seconds, self.embedded = 0.0, 0

    def __call__(self, texts, prefix: str) -> np.ndarray:
        texts = list(texts)
        missing = [t for t in dict.fromkeys(texts) if (prefix, t) not in self.where]
        if missing:
            self._embed(missing, prefix)
        return self.vectors[[self.where[prefix, t] for t in texts]]

    def _embed(self, texts, prefix):
        import tensorflow as tf

        from chatbot.model import pretrained
        if self.encoder is None:
            encoder = pretrained.load_encoder()
            run = tf.function(lambda ids: encoder(ids), input_signature=[tf.TensorSpec([None, None], tf.int32)])
            self.encoder = type("Run", (), {"hidden": encoder.hidden, "__call__": lambda _, ids: run(ids)})()
            self.tokenizer = pretrained.load_tokenizer(prefix="")
        start = time.perf_counter()
        found = pretrained.embed(self.encoder, self.tokenizer, texts, prefix, batch_size=32)
        self.seconds += time.perf_counter() - start
        self.embedded += len(texts)
        print(f"e5: {len(texts):,} texts ({prefix!r}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        for t in texts:
            self.where[prefix, t] = len(self.keys)
            self.keys.append([prefix, t])
        self.vectors = np.concatenate([self.vectors, found.astype(np.float32)])
        np.save(self.dir / "vectors.npy", self.vectors)
        (self.dir / "keys.json").write_text(json.dumps(self.keys, ensure_ascii=False), encoding="utf-8")


# --------------------------------------------------------------------------------------------- character index


def char_features(text):
    return list(text) + [text[i:i + 2] for i in range(len(text) - 1)]


class Characters:
    """TF-IDF over characters and bigrams (smooth idf, l2 rows), as `retrieval.CharacterIndex` (no n-gram is
    common enough to prune in a FAQ of a few hundred rows); `vectors` weighs any text with the index's idf."""

    def __init__(self, documents):
        self.vocabulary = {}
        for doc in documents:
            for f in char_features(doc):
                self.vocabulary.setdefault(f, len(self.vocabulary))
        found = np.zeros(len(self.vocabulary))
        for doc in documents:
            for f in set(char_features(doc)):
                found[self.vocabulary[f]] += 1
        self.idf = np.log((1 + len(documents)) / (1 + found)) + 1
        self.matrix = self.vectors(documents)

    def vectors(self, texts):
        out = np.zeros((len(texts), len(self.vocabulary)))
        for row, text in enumerate(texts):
            for f in char_features(text):
                if f in self.vocabulary:
                    out[row, self.vocabulary[f]] += 1
        out *= self.idf[None]
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)

    def cosine(self, texts):
        return self.vectors(texts) @ self.matrix.T


# ------------------------------------------------------------------------------------------------------ data


def read_faq(name):
    from chatbot.data.pairs import load_pairs
    from chatbot.retrieval.retriever import answer_documents
    pairs, _ = load_pairs(EXAMPLES / f"{name}.csv")
    pairs = list(dict.fromkeys(pairs))
    paraphrases, _ = load_pairs(EXAMPLES / f"{name}_paraphrases.csv")
    outside = [normalize(q) for q in pd.read_csv(EXAMPLES / f"{name}_out_of_scope.csv", dtype=str).Q]
    questions = [one_text(p.question) for p in pairs]
    documents, answer_of = answer_documents(pairs)
    answers = list(dict.fromkeys(p.answer for p in pairs))
    assert all(d.endswith(a) for d, a in zip(documents, answers))
    asked = defaultdict(list)
    for q, a in zip(questions, answer_of):
        asked[a].append(q)
    # each question's own answer's document without it (the same order: the other questions, then the answer)
    loo = [" ".join([o for o in asked[a] if o != q] + [answers[a]]) for q, a in zip(questions, answer_of)]
    index = {a: i for i, a in enumerate(answers)}
    return {"name": name, "questions": questions, "answer_of": answer_of, "answers": answers,
            "documents": documents, "loo": loo, "paraphrases": [normalize(p.question) for p in paraphrases],
            "expected": np.array([index[p.answer] for p in paraphrases]), "outside": outside,
            "several": np.array([len(asked[a]) > 1 for a in answer_of])}


# ----------------------------------------------------------------------------------------------- wording noise

_S0, _V, _T = 0xAC00, 21, 28


def _jamo_typo(char, rng):
    code = ord(char) - _S0
    if not 0 <= code < 11172:
        return char
    lead, vowel, tail = code // (_V * _T), code // _T % _V, code % _T
    choice = rng.random()
    if choice < 0.4:
        tail = 0 if tail else rng.choice([4, 8, 16, 21])  # drop or add a final consonant (ㄴ ㄹ ㅁ ㅇ)
    elif choice < 0.7:
        vowel = {0: 4, 4: 0, 1: 5, 5: 1, 8: 13, 13: 8, 18: 20, 20: 18}.get(vowel, (vowel + 1) % _V)
    else:
        lead = {0: 15, 15: 0, 3: 16, 16: 3, 7: 17, 17: 7, 12: 14, 14: 12}.get(lead, lead)
    return chr(_S0 + (lead * _V + vowel) * _T + tail)


def noisy(text, rng):
    """One or two of: spaces removed or one added, final punctuation dropped or doubled, a one-jamo typo, a
    casual tail (ㅠㅠ, ~, ?? ...)."""
    for _ in range(rng.choice([1, 2])):
        op = rng.randrange(5)
        if op == 0:
            text = text.replace(" ", "") if " " in text and rng.random() < 0.6 else (
                lambda i: text[:i] + " " + text[i:])(rng.randrange(1, max(2, len(text))))
        elif op == 1:
            text = text.rstrip("?.!") if text[-1:] in "?.!" else text + "??"
        elif op == 2:
            hangul = [i for i, c in enumerate(text) if "\uac00" <= c <= "\ud7a3"]
            if hangul:
                i = rng.choice(hangul)
                text = text[:i] + _jamo_typo(text[i], rng) + text[i + 1:]
        elif op == 3:
            text = text.rstrip("?.!") + rng.choice(["ㅠㅠ", "~", "??", " ㅎㅎ", "요?", "..."])
        else:
            text = text.replace("요?", "여?").replace("나요", "나여") if rng.random() < 0.5 else text.lower()
    return normalize(unicodedata.normalize("NFC", text))


def with_noise(faq, seed=12345):
    rng = random.Random(seed)
    out = dict(faq)
    out["paraphrases"] = [noisy(t, rng) for t in faq["paraphrases"]]
    out["outside"] = [noisy(t, rng) for t in faq["outside"]]
    out["asked_questions"] = [noisy(t, rng) for t in faq["questions"]]
    out["name"] = faq["name"] + " (noise)"
    return out


# ------------------------------------------------------------------------------------------------ projection


def train_projection(questions, positives, candidates=None, positive_column=None, steps=300, rate=1e-3, pull=0.0,
                     rank=0, temperature=0.05, batch=0, seed=0):
    """W (d, d) = I + delta (full) or I + A B (`rank`), trained with InfoNCE: each question's unit vector times W
    against candidate documents times W (all l2-normalised again), its positive at `positive_column` (the
    FAQ: every answer's document, the question's own answer's replaced by `positives`, its document without the
    question), or, without `candidates`, in-batch (`batch` rows a step, the batch's positives the candidates).
    `pull`: weight of ||W - I||_F^2. Returns W (float32) and the seconds it took."""
    import tensorflow as tf  # no tf.random.set_seed: it drops the eager kernels, the tokenizer's resource with them
    rng = np.random.default_rng(seed)
    d = questions.shape[1]
    eye = tf.eye(d)
    if rank:
        a = tf.Variable(rng.normal(0, 0.02, (d, rank)).astype(np.float32))
        b = tf.Variable(np.zeros((rank, d), np.float32))
        variables = [a, b]

        def delta():
            return a @ b
    else:
        full = tf.Variable(np.zeros((d, d), np.float32))
        variables = [full]

        def delta():
            return full
    optimizer = tf.keras.optimizers.Adam(rate)
    q_all, p_all = tf.constant(questions, tf.float32), tf.constant(positives, tf.float32)
    c_all = None if candidates is None else tf.constant(candidates, tf.float32)
    column = None if positive_column is None else tf.constant(positive_column, tf.int32)

    @tf.function
    def step(rows):
        with tf.GradientTape() as tape:
            w = eye + delta()
            q = tf.math.l2_normalize(tf.gather(q_all, rows) @ w, axis=1)
            p = tf.math.l2_normalize(tf.gather(p_all, rows) @ w, axis=1)
            if c_all is None:
                logits = q @ tf.transpose(p)
                labels = tf.range(tf.shape(rows)[0])
            else:
                c = tf.math.l2_normalize(c_all @ w, axis=1)
                labels = tf.gather(column, rows)
                own = tf.one_hot(labels, tf.shape(c)[0]) > 0
                logits = tf.where(own, tf.reduce_sum(q * p, axis=1, keepdims=True), q @ tf.transpose(c))
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits / temperature))
            loss += pull * tf.reduce_sum(tf.square(delta()))
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    start = time.perf_counter()
    count = len(questions)
    for _ in range(steps):
        rows = np.arange(count) if not batch else rng.choice(count, size=min(batch, count), replace=False)
        step(tf.constant(rows, tf.int32))
    w = (eye + delta()).numpy()
    return w, time.perf_counter() - start


def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


# ------------------------------------------------------------------------------------------------ scoring


class Context:
    """One FAQ's vectors under one setting (document prefix, projection W): documents, leave-one-out documents,
    training questions, and any message; the character index over the answer documents."""

    def __init__(self, faq, store, prefix=QUERY, w=None):
        self.faq, self.store, self.prefix, self.w = faq, store, prefix, w
        self.docs = self.project(store(faq["documents"], prefix))
        self.loo = self.project(store(faq["loo"], prefix))
        self.questions = self.project(store(faq["questions"], QUERY))
        self.chars = Characters(faq["documents"])
        self.loo_chars = self.chars.vectors(faq["loo"])
        self.answer_of = faq["answer_of"]
        self.count = len(faq["answers"])

    def project(self, x):
        return x if self.w is None else unit(x @ self.w)

    def messages(self, texts, own=None, loo=False):
        """What a lever reads for these messages: e5 vectors, character cosines to the documents, the rows left
        out (`own`: each message's training row, or -1), and with `loo` the row whose answer's document is
        replaced by its leave-one-out document."""
        vectors = self.project(self.store(texts, QUERY))
        own = np.full(len(texts), -1) if own is None else np.asarray(own)
        doc = vectors @ self.docs.T
        char_vectors = self.chars.vectors(texts)
        chars = char_vectors @ self.chars.matrix.T
        if loo:
            rows = np.arange(len(texts))
            doc[rows, self.answer_of[own]] = np.sum(vectors * self.loo[own], axis=1)
            chars[rows, self.answer_of[own]] = np.sum(char_vectors * self.loo_chars[own], axis=1)
        question = vectors @ self.questions.T
        left = np.zeros_like(question, bool)
        left[np.flatnonzero(own >= 0), own[own >= 0]] = True
        # an answer none of whose rows is left can not be found (its rows are all the message's own text)
        present = np.zeros((len(texts), self.count), bool)
        for a in range(self.count):
            present[:, a] = (~left[:, self.answer_of == a]).any(axis=1)
        best_question = np.full((len(texts), self.count), -np.inf)
        masked = np.where(left, -np.inf, question)
        for a in range(self.count):
            best_question[:, a] = masked[:, self.answer_of == a].max(axis=1)
        return {"doc": doc, "chars": chars, "question": best_question, "present": present}


def zscore(x):
    return (x - x.mean(axis=1, keepdims=True)) / np.maximum(x.std(axis=1, keepdims=True), 1e-6)


def lever_docs(m):
    return m["doc"]


def lever_mean(m):
    return (m["doc"] + m["question"]) / 2


def lever_max(m):
    return np.maximum(m["doc"], m["question"])


def lever_chars(m):
    return m["chars"]


def lever_fused(c0=None, weight=0.5):
    """e5's document cosine rescaled ((cos - c0) / (1 - c0), or per-query z-scores of both) plus `weight` times
    the character document cosine, over 1 + weight."""
    def score(m):
        if c0 is None:
            return (zscore(m["doc"]) + weight * zscore(m["chars"])) / (1 + weight)
        return ((m["doc"] - c0) / (1 - c0) + weight * m["chars"]) / (1 + weight)
    return score


def lever_rescore(k=3, c0=0.8, weight=0.5):
    """e5's top-k answers by document cosine, re-scored as `lever_fused(c0, weight)`; the others out."""
    fused = lever_fused(c0, weight)

    def score(m):
        doc = np.where(m["present"], m["doc"], -np.inf)
        top = np.argsort(-doc, axis=1)[:, :k]
        out = np.full_like(doc, -np.inf)
        rows = np.arange(len(doc))[:, None]
        out[rows, top] = fused(m)[rows, top]
        return out
    return score


def evaluate(ctx, lever, faq=None, folds=None):
    """The row's numbers for one FAQ (`faq`: the asking texts, default the context's). A lever returns a score
    matrix (messages, answers), or two: the one that ranks and the one whose value at the top answer is compared
    with the threshold. `folds`: [(context, rows)], the leave-one-out calibration scores each fold's rows with its
    own context (a projection trained without them), instead of `ctx`."""
    faq = faq or ctx.faq

    def scores(texts, own=None, loo=False, context=ctx):
        m = context.messages(texts, own, loo)
        out = lever(m)
        rank, gate = out if isinstance(out, tuple) else (out, out)
        rank = np.where(m["present"], rank, -np.inf)
        top = rank.argmax(1)
        return top, np.where(m["present"], gate, -np.inf)[np.arange(len(top)), top]

    top, inside = scores(faq["paraphrases"])
    outside = scores(faq["outside"])[1]
    rows = np.flatnonzero(faq["several"])
    calibrate = [faq["questions"][i] for i in rows]
    enough = len(rows) >= 10
    threshold = float(np.quantile(scores(calibrate, rows)[1], 0.05)) if enough else 0.0
    if folds:
        best = np.concatenate([scores([faq["questions"][i] for i in part], part, True, context)[1]
                               for context, part in folds if len(part)])
    else:
        best = scores(calibrate, rows, loo=True)[1]
    loo_threshold = float(np.quantile(best, 0.05)) if enough else 0.0
    asked, asked_best = scores(faq.get("asked_questions", faq["questions"]))
    balanced = max((np.mean(inside >= t) + np.mean(outside < t)) / 2
                   for t in np.unique(np.concatenate([inside, outside, [np.inf]])))
    return {"right": np.mean(top == faq["expected"]),
            "out_fb": np.mean(outside < threshold), "para_fb": np.mean(inside < threshold),
            "out_fb_loo": np.mean(outside < loo_threshold), "para_fb_loo": np.mean(inside < loo_threshold),
            "at_ten": np.mean(outside < np.quantile(inside, 0.1)), "balanced": balanced,
            "train": np.mean((asked == ctx.answer_of) & (asked_best >= threshold)),
            "threshold": threshold, "loo_threshold": loo_threshold}


class Hybrid:
    """Two contexts of one FAQ (projected, plain): a lever reads both ("proj", "plain")."""

    def __init__(self, projected, plain):
        self.projected, self.plain, self.faq, self.answer_of = projected, plain, plain.faq, plain.answer_of

    def messages(self, texts, own=None, loo=False):
        return {"proj": self.projected.messages(texts, own, loo), "plain": self.plain.messages(texts, own, loo),
                "present": self.plain.messages(texts, own, loo)["present"]}


def lever_hybrid(m):
    """The projection ranks; the plain e5 document cosine of its top answer meets the threshold."""
    return m["proj"]["doc"], m["plain"]["doc"]


def lever_hybrid_mean(m):
    """The projection ranks; mean(plain best question cosine, plain document cosine) of its top answer gates."""
    return m["proj"]["doc"], lever_mean(m["plain"])


COLUMNS = [("paraphrases right", "right"), ("train calib: out-of-scope fallback", "out_fb"),
           ("train calib: paraphrases fallback", "para_fb"), ("LOO calib: out-of-scope fallback", "out_fb_loo"),
           ("LOO calib: paraphrases fallback", "para_fb_loo"),
           ("out-of-scope fallback at 10% paraphrase fallback", "at_ten"), ("best balanced accuracy", "balanced"),
           ("training questions right", "train")]


def row(label, results):
    cells = [" / ".join(f"{r[key]:.0%}" for r in results) for _, key in COLUMNS]
    return f"| {label} | " + " | ".join(cells) + " |"


def header():
    return ("| lever (shop / library) | " + " | ".join(c for c, _ in COLUMNS) + " |\n|---|"
            + "---|" * len(COLUMNS))


def chat_examples(seed=0):
    """The general adapter's data: per situation of data/chat_*.csv two questions ask, and one document (two
    other questions of the situation and the answer of a third, as a FAQ's answer document reads) is their
    positive. Returns asks, their documents, and each ask's document row."""
    rng = random.Random(seed)
    frame = pd.concat([pd.read_csv(f, dtype=str, keep_default_na=False)
                       for f in sorted((ROOT / "data").glob("chat_*.csv"))])
    asks, documents, of = [], [], []
    for _, group in sorted(frame.groupby("situation")):
        rows = list(zip(group.Q.map(normalize), group.A.map(normalize)))
        if len(rows) < 5:
            continue
        rng.shuffle(rows)
        documents.append(" ".join([rows[2][0], rows[3][0], rows[4][1]]))
        for q, _ in rows[:2]:
            asks.append(q)
            of.append(len(documents) - 1)
    return asks, documents, np.array(of)


def faq_projection(ctx, steps, pull, rank=0, rate=1e-3, rows=None, seed=0):
    """W trained on one FAQ (`rows`: these training questions only): every training question against every
    answer's document, its own answer's built without it (the unprojected vectors of `ctx`)."""
    rows = np.arange(len(ctx.questions)) if rows is None else rows
    return train_projection(ctx.questions[rows], ctx.loo[rows], ctx.docs, ctx.answer_of[rows], steps=steps,
                            rate=rate, pull=pull, rank=rank, seed=seed)


FOLDS = 5


def projected(faq, store, plain, steps, pull, rank=0, rate=1e-3, prefix=QUERY):
    """The serving context (W trained on every training question), the calibration folds (each fold's questions
    with a W trained without them) and the seconds one full training took."""
    w, seconds = faq_projection(plain, steps, pull, rank, rate)
    order = np.random.default_rng(0).permutation(len(faq["questions"]))
    folds = []
    for k in range(FOLDS):
        part = np.sort(order[k::FOLDS])
        rest = np.setdiff1d(np.arange(len(order)), part)
        wk, _ = faq_projection(plain, steps, pull, rank, rate, rows=rest)
        folds.append((Context(faq, store, prefix, wk), part[faq["several"][part]]))
    return Context(faq, store, prefix, w), folds, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "faq_levers"), help="embedding cache folder")
    parser.add_argument("--noise", action="store_true", help="also the best levers on held-out wording noise")
    parser.add_argument("--quick", action="store_true", help="only levers 1-3 (no projection training)")
    parser.add_argument("--pull", type=float, default=0.01, help="the projection's pull toward identity")
    parser.add_argument("--rate", type=float, default=1e-3, help="the projection's Adam learning rate")
    args = parser.parse_args(argv)
    store = Store(args.cache)
    faqs = [read_faq(n) for n in ("shop_faq", "library_faq")]
    plain = [Context(f, store) for f in faqs]
    print(header())

    def show(label, contexts, lever, noise=False):
        results = [evaluate(c, lever, with_noise(c.faq) if noise else None) for c in contexts]
        print(row(label, results), flush=True)
        return results

    show("1. e5 answer documents q/q (today)", plain, lever_docs)
    show("char answer documents alone", plain, lever_chars)
    show("2. mean(best question cosine, document cosine)", plain, lever_mean)
    show("2. max(best question cosine, document cosine)", plain, lever_max)
    for c0 in (0.7, 0.8):
        for weight in (0.25, 0.5, 1.0):
            show(f"3. e5 (cos - {c0}) / {1 - c0:.1f} + {weight} x char docs", plain, lever_fused(c0, weight))
    for weight in (0.25, 0.5, 1.0):
        show(f"3. e5 z + {weight} x char docs z (per query)", plain, lever_fused(None, weight))
    if args.quick:
        return 0

    store(sum((f["documents"] + f["loo"] for f in faqs), []), PASSAGE)  # before any training (see above)
    asks, documents, of = chat_examples()
    ask_vectors, doc_vectors = store(asks, QUERY), store(documents, QUERY)

    def show_projected(label, built, lever=lever_docs, noise=False, hybrid=None):
        contexts = [c for c, _, _ in built]
        folds = [f for _, f, _ in built]
        if hybrid:
            contexts = [Hybrid(c, p) for c, p in zip(contexts, plain)]
            folds = [[(Hybrid(c, p), part) for c, part in f] for f, p in zip(folds, plain)]
        results = [evaluate(c, lever, with_noise(c.faq) if noise else None, f) for c, f in zip(contexts, folds)]
        print(row(label, results), flush=True)

    seconds, built = {}, {}
    grid = [(0, 0.0, 100), (0, 0.0, 300), (0, args.pull, 100), (0, args.pull, 300), (0, args.pull, 1000),
            (0, 10 * args.pull, 300), (0, 100 * args.pull, 300), (32, args.pull, 300)]
    for rank, pull, steps in grid:
        built[rank, pull, steps] = [projected(f, store, c, steps, pull, rank, args.rate) for f, c in zip(faqs, plain)]
        seconds[rank, pull, steps] = [s for _, _, s in built[rank, pull, steps]]
        kind = "full W" if rank == 0 else f"I + rank-{rank}"
        show_projected(f"4. FAQ projection, {kind}, pull {pull}, {steps} steps", built[rank, pull, steps])
    print("projection training seconds (shop, library): " + "; ".join(
        f"rank {r} pull {p} {s} steps: {a:.1f}, {b:.1f}" for (r, p, s), (a, b) in seconds.items()), file=sys.stderr)
    for rank, pull, steps in [(0, 0.0, 300), (0, args.pull, 300), (0, 10 * args.pull, 300)]:
        show_projected(f"4h. FAQ projection (pull {pull}, {steps} steps) ranks, plain e5 doc cosine gates",
                       built[rank, pull, steps], lever_hybrid, hybrid=True)
        show_projected(f"4h. FAQ projection (pull {pull}, {steps} steps) ranks, plain lever-2 mean gates",
                       built[rank, pull, steps], lever_hybrid_mean, hybrid=True)
    best = built[0, args.pull, 300]
    show_projected(f"4+2. FAQ projection (pull {args.pull}, 300 steps), lever-2 mean", best, lever_mean)
    show_projected(f"4+3. FAQ projection (pull {args.pull}, 300 steps), (cos - 0.8) / 0.2 + 0.5 x char docs", best,
                   lever_fused(0.8, 0.5))

    for pull in (0.0, args.pull):
        for steps in (300, 1000):
            w, took = train_projection(ask_vectors, doc_vectors[of], steps=steps, rate=args.rate, pull=pull,
                                       batch=256)
            print(f"chat adapter pull {pull} {steps} steps: {took:.1f} s", file=sys.stderr)
            show(f"5. everyday-data adapter, full W, pull {pull}, {steps} steps",
                 [Context(f, store, w=w) for f in faqs], lever_docs)

    passage = [Context(f, store, prefix=PASSAGE) for f in faqs]
    show("6. e5 answer documents q/p (\"passage: \")", passage, lever_docs)
    show_projected(f"6. q/p + FAQ projection, full W, pull {args.pull}, 300 steps",
                   [projected(f, store, c, 300, args.pull, 0, args.rate, PASSAGE) for f, c in zip(faqs, passage)])
    for k in (3, 5):
        show(f"6. e5 top-{k} re-scored: (cos - 0.8) / 0.2 + 0.5 x char docs", plain, lever_rescore(k))
    if args.noise:
        print()
        print("Held-out wording noise (seed 12345; paraphrases, out-of-scope and training questions each noised "
              "once; calibration on the clean training questions):")
        print(header())
        show("1. e5 answer documents q/q (today), noise", plain, lever_docs, noise=True)
        show("2. mean(best question cosine, document cosine), noise", plain, lever_mean, noise=True)
        show_projected(f"4. FAQ projection, full W, pull {args.pull}, 300 steps, noise", best, noise=True)
        show_projected(f"4h. FAQ projection (pull {args.pull}, 300 steps) ranks, plain lever-2 mean gates, noise",
                       best, lever_hybrid_mean, noise=True, hybrid=True)
    print(f"e5: {store.embedded} texts embedded this run in {store.seconds:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

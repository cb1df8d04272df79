"""Reply quality on held-out questions, side by side in one run.

Splits ChatbotData by question (5% held out, fixed seed), then scores on the held-out questions:

  (a) tutorial   the seed tutorial's recipe rebuilt: SubwordTextEncoder (2**13), spaces around ?.!,
                 START/END = vocab, vocab + 1, pairs <= 40 tokens post-padded to 40, batches of 64,
                 loss masked then averaged over every position (pads included), the warmup schedule,
                 the same 4-layer d_model-128 transformer, greedy decoding that re-runs the model on the
                 whole prefix for every token (its replies get their punctuation re-attached before
                 scoring, which only helps it);
  (b) retrieval  no learning: the answer of the nearest training question (TF-IDF, character bigrams),
                 and the same with the index the model reads (`chatbot.retrieval.retriever`: characters and bigrams),
                 so what (c) gains from its index shows as such;
  (c) ours       `chatbot.training.train.train` with this package's defaults (plus any --set overrides), then
                 the default decoding (plus any --decode variants).

(a) and (c) get the same training budget (`--budget-min`), counted as this process's CPU time divided
by the cores it may use: on an idle machine that is wall-clock time, and a busy shared machine slows
neither side more than the other. Metrics: chrF, character BLEU, exact match, unique-reply ratio,
distinct-1/2 (see chatbot/training/evaluate.py). Replies of every row go to --out as CSV.

    python bench/quality.py --budget-min 35                        # the full comparison
    python bench/quality.py --budget-min 8 --only ours --set train.label_smoothing=0.1
    python bench/quality.py --only ours --decode strategy=beam,num_beams=4,length_penalty=1.2
    python bench/quality.py --only ours --model /tmp/quality-xyz/model --decode candidates=0 --decode ""

`--model` scores more decoding variants of a (c) that an earlier run trained (it prints where the model
is; its training minutes are kept beside it in budget.json), without training again.
"""

import argparse
import dataclasses
import json
import math
import os
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from common import SHARED_DATA, parse_decode

MAX_LENGTH = 40


# -- shared ------------------------------------------------------------------------------------

def cpu_minutes() -> float:
    """CPU time of this process divided by the cores it may use (wall-clock on an idle machine)."""
    return time.process_time() / len(os.sched_getaffinity(0)) / 60


def budget_callback(minutes: float):
    import keras

    class Budget(keras.callbacks.Callback):
        """Stop training once `minutes` of (core-normalised) CPU time have been spent in `fit`."""

        def on_train_begin(self, logs=None):
            self.start, self.epochs = cpu_minutes(), 0

        def on_train_batch_end(self, batch, logs=None):
            if cpu_minutes() - self.start >= minutes:
                self.model.stop_training = True

        def on_epoch_end(self, epoch, logs=None):
            self.epochs = epoch + 1

        def spent(self):
            return cpu_minutes() - self.start

    return Budget()


def score(name, replies, test, out_dir, extra=None):
    from chatbot.training.evaluate import reply_metrics, write_replies

    row = {"row": name, **reply_metrics(replies, [p.answer for p in test]), **(extra or {})}
    file_name = re.sub(r"[^\w.=-]+", "_", name) + ".csv"
    write_replies(Path(out_dir) / file_name, [p.question for p in test],
                  [p.answer for p in test], replies)
    print(format_row(row), flush=True)
    return row


def format_row(row) -> str:
    extra = " ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()
                     if k not in HEADER_KEYS and k != "row")
    return (f"{row['row'][:44]:44s} {row['chrf']:6.2f} {row['bleu_char']:6.2f} {row['exact_match']:7.1%} "
            f"{row['unique_ratio']:7.1%} {row['distinct_1']:6.3f} {row['distinct_2']:6.3f}  {extra}")


HEADER_KEYS = ("chrf", "bleu_char", "exact_match", "unique_ratio", "distinct_1", "distinct_2", "mean_reply_chars")
HEADER = f"{'row':44s} {'chrF':>6s} {'BLEUc':>6s} {'exact':>7s} {'unique':>7s} {'dist1':>6s} {'dist2':>6s}"


# -- (b) nearest-question retrieval ------------------------------------------------------------

def bigrams(text: str) -> Counter:
    return Counter(text[i:i + 2] for i in range(len(text) - 1)) or Counter([text])


def nearest_question_answers(train, test) -> list[str]:
    """For each test question, the answer of the training question with the highest TF-IDF cosine
    over character bigrams (smooth idf, l2-normalised, as scikit-learn's TfidfVectorizer)."""
    docs = [bigrams(p.question) for p in train]
    df = Counter(gram for doc in docs for gram in doc)
    idf = {gram: math.log((1 + len(docs)) / (1 + count)) + 1 for gram, count in df.items()}
    postings: dict[str, list[tuple[int, float]]] = {}
    for i, doc in enumerate(docs):
        weights = {g: c * idf[g] for g, c in doc.items()}
        norm = math.sqrt(sum(w * w for w in weights.values()))
        for gram, weight in weights.items():
            postings.setdefault(gram, []).append((i, weight / norm))
    postings = {g: (np.array([i for i, _ in p]), np.array([w for _, w in p])) for g, p in postings.items()}
    replies = []
    for pair in test:
        scores = np.zeros(len(docs))
        for gram, count in bigrams(pair.question).items():
            if gram in postings:
                ids, weights = postings[gram]
                scores[ids] += count * idf[gram] * weights
        replies.append(train[int(np.argmax(scores))].answer)
    return replies


def index_answers(train, test) -> list[str]:
    """The nearest training answer by the index a model trained on `train` retrieves from, asked as (c) is
    asked (no tone)."""
    from chatbot.retrieval.retriever import Retriever

    found = Retriever(train).nearest([p.question for p in test], 1)
    return [row[0].decode("utf-8") for row in found.numpy()]


# -- (a) the seed tutorial's recipe ------------------------------------------------------------

def tutorial_preprocess(sentence: str) -> str:
    return re.sub(r"([?.!,])", r" \1 ", sentence).strip()


def run_tutorial(train, test, budget_min, out_dir, batch_size=64):
    import keras
    import tensorflow as tf
    import tensorflow_datasets as tfds

    from chatbot.model.transformer import Transformer
    from chatbot.training.optimizer import transformer_optimizer

    questions = [tutorial_preprocess(p.question) for p in train]
    answers = [tutorial_preprocess(p.answer) for p in train]
    encoder = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(questions + answers, target_vocab_size=2**13)
    start, end = encoder.vocab_size, encoder.vocab_size + 1
    inputs, outputs = [], []
    for question, answer in zip(questions, answers):
        q, a = [start, *encoder.encode(question), end], [start, *encoder.encode(answer), end]
        if len(q) <= MAX_LENGTH and len(a) <= MAX_LENGTH:
            inputs.append(q + [0] * (MAX_LENGTH - len(q)))
            outputs.append(a + [0] * (MAX_LENGTH - len(a)))
    inputs, outputs = np.array(inputs, np.int32), np.array(outputs, np.int32)
    data = (tf.data.Dataset.from_tensor_slices(((inputs, outputs[:, :-1]), outputs[:, 1:]))
            .cache().shuffle(20000).batch(batch_size).prefetch(tf.data.AUTOTUNE))

    def loss_function(y_true, y_pred):  # masked, then averaged over every position, pads included
        loss = keras.losses.sparse_categorical_crossentropy(y_true, y_pred, from_logits=True)
        return tf.reduce_mean(loss * tf.cast(tf.not_equal(y_true, 0), loss.dtype))

    model = Transformer(encoder.vocab_size + 2, max_length=MAX_LENGTH)
    model.compile(optimizer=transformer_optimizer(128), loss=loss_function)
    budget = budget_callback(budget_min)
    model.fit(data, epochs=10_000, callbacks=[budget], verbose=0)

    @tf.function
    def logits_at(encoder_ids, decoder_ids, index):
        # The whole model on the whole prefix for every new token, as the tutorial does; the prefix is
        # padded to MAX_LENGTH so that one trace serves every step (the causal mask hides the padding).
        logits = model((encoder_ids, decoder_ids), training=False)
        return tf.argmax(tf.gather(logits, index, axis=1), axis=-1, output_type=tf.int32)

    replies = []
    for first in range(0, len(test), 128):
        chunk = test[first:first + 128]
        ids = [[start, *encoder.encode(tutorial_preprocess(p.question)), end][:MAX_LENGTH] for p in chunk]
        encoder_ids = tf.constant([row + [0] * (MAX_LENGTH - len(row)) for row in ids])
        output = np.zeros((len(chunk), MAX_LENGTH), np.int32)
        output[:, 0] = start
        done = np.zeros(len(chunk), bool)
        for index in range(MAX_LENGTH - 1):
            token = logits_at(encoder_ids, tf.constant(output), tf.constant(index)).numpy()
            token[done] = 0
            output[:, index + 1] = token
            done |= token == end
            if done.all():
                break
        for row in output[:, 1:].tolist():
            row = row[:row.index(end)] if end in row else row
            reply = encoder.decode([t for t in row if 0 < t < encoder.vocab_size])
            replies.append(re.sub(r" ([?.!,])", r"\1", reply).strip())
    keras.backend.clear_session()
    return replies, {"epochs": budget.epochs, "train_min": budget.spent()}


# -- (c) this package ------------------------------------------------------------------------

def apply_overrides(config, settings: list[str]):
    """`train.label_smoothing=0.1` style overrides of a ChatbotConfig."""
    for setting in settings:
        key, _, value = setting.partition("=")
        section, _, name = key.partition(".")
        current = getattr(config, section)
        kind = type(getattr(current, name))
        parsed = json.loads(value) if kind is not str else value
        config = dataclasses.replace(config, **{section: dataclasses.replace(current, **{name: parsed})})
    return config


def run_ours(train_pairs, test, budget_min, out_dir, settings, decodes, trained=None, fit_rerank=False):
    import keras

    from chatbot.config import ChatbotConfig
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.training.train import train

    if trained:
        model_dir = Path(trained)
        budget_file = model_dir.parent / "budget.json"
        info = json.loads(budget_file.read_text()) if budget_file.is_file() else {}
        bot = Chatbot.load(model_dir)
        return score_ours(refit_rerank(bot, train_pairs) if fit_rerank else bot, test, out_dir, settings, decodes,
                          info, {})
    config = apply_overrides(ChatbotConfig(), settings)
    config = dataclasses.replace(config, train=dataclasses.replace(config.train, epochs=10_000))
    model_dir = Path(tempfile.mkdtemp(prefix="quality-")) / "model"
    weights = {name: model_dir.parent / f"{name}.weights.h5" for name in ("loss", "last")}
    budget = budget_callback(budget_min)

    class KeepLast(keras.callbacks.Callback):
        def on_train_end(self, logs=None):
            self.model.save_weights(str(weights["last"]))

    extra = [budget, KeepLast()]
    if config.data.val_fraction and config.train.select != "loss":
        extra.append(keras.callbacks.ModelCheckpoint(str(weights["loss"]), monitor="val_loss", save_best_only=True,
                                                     save_weights_only=True))
    train(train_pairs, config, model_dir, callbacks=extra, verbose=0, log=lambda *_: None)
    info = {"epochs": budget.epochs, "train_min": budget.spent()}
    (model_dir.parent / "budget.json").write_text(json.dumps(info))
    history = (model_dir / "history.csv").read_text(encoding="utf-8").splitlines()
    print(f"  ours: {len(history) - 1} epochs; history in {model_dir / 'history.csv'}", flush=True)
    return score_ours(Chatbot.load(model_dir), test, out_dir, settings, decodes, info, weights)


def refit_rerank(bot, train_pairs):
    """`bot` with rerank weights fitted as `train` fits them: on its own validation split, retrieving from
    the rest of its training pairs. The fitting's CPU minutes are printed; they are not in the budget."""
    from chatbot.data.pairs import split_by_question
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.retrieval.retriever import Retriever
    from chatbot.training.best_epoch import fit_rerank

    started = cpu_minutes()
    fit_pairs, val_pairs = split_by_question(train_pairs, bot.config.data.val_fraction, bot.config.data.seed)
    fitting = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=Retriever(fit_pairs), compilation="graph")
    weights = fit_rerank(fitting, val_pairs, log=lambda line: print(f"  ours: {line}", flush=True))
    print(f"  ours: fitting took {cpu_minutes() - started:.1f} CPU min", flush=True)
    return Chatbot(bot.model, bot.tokenizer, dataclasses.replace(bot.config, rerank=weights), bot.path, bot.retriever)


def score_ours(bot, test, out_dir, settings, decodes, info, weights):
    """Rows of (c): each decoding variant, then greedy replies of the other kept weights, if any."""
    label = "ours" + "".join(f" {s}" for s in settings)
    rows = []
    for decode in decodes:
        options = parse_decode(decode)
        rows.append(score(f"{label} [{bot.config.train.select}] {decode or 'default'}",
                          reply_all(bot, test, options), test, out_dir, info))
    for name, path in weights.items():
        if path.is_file():
            bot.model.load_weights(str(path))
            rows.append(score(f"{label} [select {name}] greedy", reply_all(bot, test, {"candidates": 0}), test,
                              out_dir, info))
    return rows


def reply_all(bot, test, options):
    from chatbot.training.evaluate import replies_to

    return replies_to(bot, [p.question for p in test], **options)


# -- main ------------------------------------------------------------------------------------

def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--data", default=str(SHARED_DATA), help="Q&A CSV (default: ../shared/data/ChatbotData.csv)")
    parser.add_argument("--budget-min", type=float, default=35.0,
                        help="training minutes for (a) and for (c), each (CPU time / cores)")
    parser.add_argument("--held-out", type=float, default=0.05, help="share of questions held out")
    parser.add_argument("--seed", type=int, default=0, help="seed of the held-out split")
    parser.add_argument("--only", choices=["all", "tutorial", "retrieval", "ours"], default="all")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                        help="override a setting of (c), e.g. train.label_smoothing=0.1 (repeatable)")
    parser.add_argument("--decode", action="append", default=None, metavar="K=V,...",
                        help="decoding variants of (c), e.g. strategy=beam,num_beams=4 (repeatable; \"\" is the "
                             "default decoding, the default row)")
    parser.add_argument("--model", default=None, metavar="DIR",
                        help="score (c) with a model an earlier run trained instead of training one")
    parser.add_argument("--fit-rerank", action="store_true",
                        help="with --model: fit its rerank weights on its validation split first, as train does now "
                             "(for a model trained before train fitted them)")
    parser.add_argument("--out", default="bench/quality_replies", help="folder for the replies of every row")
    parser.add_argument("--results", default=None, help="append the rows as JSON lines to this file")
    return parser.parse_args()


def main():
    args = parse_args()
    from chatbot.data.pairs import load_pairs, split_by_question

    pairs, _ = load_pairs(args.data)
    train, test = split_by_question(pairs, args.held_out, args.seed)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    print(f"data: {args.data}: {len(train)} training pairs, {len(test)} held-out pairs "
          f"(questions disjoint, seed {args.seed}); budget {args.budget_min} min per trained row")
    print(HEADER)
    rows = []
    if args.only in ("all", "retrieval"):
        rows.append(score("(b) retrieval: nearest question, TF-IDF", nearest_question_answers(train, test), test,
                          args.out))
        rows.append(score("(b) the model's index: characters + bigrams", index_answers(train, test), test, args.out))
    if args.only in ("all", "tutorial"):
        replies, info = run_tutorial(train, test, args.budget_min, args.out)
        rows.append(score("(a) tutorial recipe", replies, test, args.out, info))
    if args.only in ("all", "ours"):
        rows += run_ours(train, test, args.budget_min, args.out, args.set, args.decode or [""], args.model,
                         args.fit_rerank)
    if args.results:
        with open(args.results, "a", encoding="utf-8") as file:
            for row in rows:
                file.write(json.dumps({**row, "budget_min": args.budget_min}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()

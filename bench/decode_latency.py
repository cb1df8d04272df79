"""Reply latency: the seed tutorial's full-recompute greedy loop vs cached XLA-compiled decoding, in one run.

For 100 questions it prints p50/p95 milliseconds per reply for: the seed tutorial's loop (re-runs
the encoder and the whole decoder prefix for every token, eagerly), cached greedy compiled as a plain
graph (the previous path) and with XLA, the default decoding (`GenerationConfig()`, XLA), greedy with 8
retrieved answers weighed against the reply (`candidates`), the default decoding of a follow-up with the
two messages before it (`history`: the first exchange of each `bench/followups.csv` conversation), beam search
(width 4; width 8 with `agreement`) and top-p sampling,
single requests and batches of 32; time to first token and per token when streaming; then the
speedups over the tutorial's loop. A model whose retrieval reads meaning with the pretrained encoder also gets
the row of that encoder's pass alone (one message, as a reply runs it). Several `--model`s are measured one after
another in the same run, and their default replies compared at the end.

    python bench/decode_latency.py [--model models/default [--model OTHER]] [--questions 100]
"""

import argparse
import csv
import time
import warnings

import numpy as np

from common import BUNDLED_DATA, ROOT


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", help="a model directory (repeat to compare; default: "
                        "models/default)")
    parser.add_argument("--data", default=str(BUNDLED_DATA), help="questions come from here")
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--naive-questions", type=int, default=100, help="how many of them the slow naive loop answers")
    return parser.parse_args()


def percentiles(milliseconds):
    return np.percentile(milliseconds, 50), np.percentile(milliseconds, 95)


def time_each(fn, items):
    times = []
    for item in items:
        start = time.perf_counter()
        fn(item)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main():
    args = parse_args()
    # The naive loop's first step attends over one position; Keras warns about that softmax.
    warnings.filterwarnings("ignore", message="You are using a softmax over axis -1")
    measured = {model: measure(model, args) for model in args.model or [str(ROOT / "models" / "default")]}
    if len(measured) > 1:
        first = next(iter(measured))
        for model, results in measured.items():
            print(f"default reply p50 of {model}: {results['default'][0]:.2f} ms "
                  f"({results['default'][0] / measured[first]['default'][0]:.2f}x {first}'s)")


def measure(model: str, args) -> dict:
    from chatbot.data.pairs import load_pairs
    from chatbot.decoding.chatbot import Chatbot

    args.model = model
    bot = Chatbot.load(args.model)
    plain = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=bot.retriever, compilation="graph")
    pairs, _ = load_pairs(args.data)
    questions = [p.question for p in pairs[: args.questions]]
    from chatbot.config import GenerationConfig

    default = GenerationConfig()
    with open(ROOT / "bench" / "followups.csv", newline="", encoding="utf-8") as file:
        exchanges = [[{"role": "user", "content": row["first"]}, {"role": "assistant", "content": row["reply"]}]
                     for row in csv.DictReader(file)]
    histories = {q: exchanges[i % len(exchanges)] for i, q in enumerate(questions)}
    print(f"model: {args.model}; {len(questions)} questions from {args.data}; default decoding: "
          f"{default.strategy}, candidates={default.candidates}")

    single = {
        "tutorial loop": lambda q: bot.naive_reply(q),
        "cached, no XLA": lambda q: plain.reply(q, candidates=0),
        "cached greedy": lambda q: bot.reply(q, candidates=0),
        "default": lambda q: bot.reply(q),
        "default + 2-turn history": lambda q: bot.reply(q, history=histories[q]),
        "greedy + 8 candidates": lambda q: bot.reply(q, candidates=8),
        "cached beam 4": lambda q: bot.reply(q, strategy="beam", num_beams=4, candidates=0),
        "beam 8 + agreement 4": lambda q: bot.reply(q, strategy="beam", num_beams=8, agreement=4, candidates=0),
        "cached top-p 0.9": lambda q: bot.reply(q, strategy="sample", top_p=0.9, seed=0, candidates=0),
    }
    if bot.retriever is not None and bot.retriever.config.pretrained:
        import tensorflow as tf

        # as a reply's prepare graph runs it: traced once, XLA inside where the bot compiles its loops
        cosine = tf.function(bot.retriever.pretrained.cosine, input_signature=[tf.TensorSpec([None], tf.string)])
        single["pretrained encoder alone"] = lambda q: cosine(tf.constant([q])).numpy()
    for name, fn in single.items():  # warm up: trace and compile every shape (encoder length buckets) first
        for question in questions[:1] if name.startswith("tutorial") else questions:
            fn(question)
    results = {}
    for name, fn in single.items():
        items = questions[: args.naive_questions] if name.startswith("tutorial") else questions
        results[name] = percentiles(time_each(fn, items))

    batches = [questions[i:i + 32] for i in range(0, len(questions), 32)]
    batch_fns = {
        "batch32 greedy": lambda b: bot.reply_batch(b, candidates=0),
        "batch32 default": lambda b: bot.reply_batch(b),
        "batch32 + 8 candidates": lambda b: bot.reply_batch(b, candidates=8),
        "batch32 beam 4": lambda b: bot.reply_batch(b, strategy="beam", num_beams=4, candidates=0),
        "batch32 top-p 0.9": lambda b: bot.reply_batch(b, strategy="sample", top_p=0.9, seed=0, candidates=0),
    }
    for name, fn in batch_fns.items():
        for batch in batches:  # warm up every batch shape
            fn(batch)
        per_reply = [t / len(b) for t, b in zip(time_each(fn, batches), batches)]
        results[name] = percentiles(per_reply)

    first_token, per_token = [], []
    for question in questions:  # warm up the streaming step for every encoder length bucket
        list(bot.stream(question, candidates=0))
    for question in questions:
        start = time.perf_counter()
        chunks = 0
        for _ in bot.stream(question, candidates=0):
            if not chunks:
                first_token.append((time.perf_counter() - start) * 1000)
            chunks += 1
        if chunks > 1:
            per_token.append(((time.perf_counter() - start) * 1000 - first_token[-1]) / (chunks - 1))
    results["stream: first token"] = percentiles(first_token)
    results["stream: per token"] = percentiles(per_token)

    print(f"{'':24s} {'p50 ms':>9s} {'p95 ms':>9s}   (per reply)")
    for name, (p50, p95) in results.items():
        print(f"{name:24s} {p50:9.2f} {p95:9.2f}")
    tutorial = results["tutorial loop"][0]
    for name in ("cached, no XLA", "cached greedy", "default", "cached beam 4", "batch32 greedy"):
        print(f"speedup of {name} over the tutorial's loop (p50): {tutorial / results[name][0]:.1f}x")
    print(f"beam 4 cost relative to greedy (p50): {results['cached beam 4'][0] / results['cached greedy'][0]:.2f}x")
    return results


if __name__ == "__main__":
    main()

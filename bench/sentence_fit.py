"""The sentence encoder's fit, eager vs traced: when is tracing the training step worth it?

`train` fits a sentence encoder on the questions that share an answer before it fits the transformer (from
scratch only; a model built on a base keeps the base's). A small CSV gives it a few steps, and tracing the step
then costs more than running every step eagerly. For data of several sizes (the first N pairs of the data file)
this times `fit_sentence_encoder` both ways, side by side in alternating rounds of one run, and prints the
steps, the seconds of each and the ratio; `sentence.EAGER_STEPS` is where eager stops paying.

    python bench/sentence_fit.py [--data CSV] [--sizes 30 100 300] [--rounds 2]

Data: ../shared/data/ChatbotData.csv when present, else the bundled data/korean_chat.csv.
"""

import argparse
import math
import statistics
import time

from common import DEFAULT_DATA


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--sizes", type=int, nargs="+", default=[30, 100, 300], help="pairs per row")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (the machine is noisy)")
    args = parser.parse_args(argv)

    from chatbot.startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import keras

    from chatbot import sentence
    from chatbot.data import load_pairs
    from chatbot.tokenizer import Tokenizer
    from chatbot.train import SENTENCE_EPOCHS

    pairs, _ = load_pairs(args.data)
    compile_as_asked = keras.Model.compile
    print(f"data: {args.data}; {SENTENCE_EPOCHS} epochs (train's); batch 128; EAGER_STEPS = {sentence.EAGER_STEPS}")
    print("| pairs | steps | traced (s) | eager (s) | eager / traced |")
    print("|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        texts, groups = sentence.answer_groups(pairs[:size])
        tokenizer = Tokenizer.train(texts, min(4000, 50 + 4 * len(texts)))
        ids = tokenizer.encode(texts)
        members = sum(len(group) for group in groups if len(group) > 1)
        steps = max(1, math.ceil(members * SENTENCE_EPOCHS / 128))
        seconds = {True: [], False: []}
        for _ in range(args.rounds):
            for eager in (False, True):
                def compile_so(model, *a, _eager=eager, **k):
                    return compile_as_asked(model, *a, **{**k, "run_eagerly": _eager})

                keras.Model.compile = compile_so
                start = time.perf_counter()
                sentence.fit_sentence_encoder(ids, groups, tokenizer.vocab_size, epochs=SENTENCE_EPOCHS)
                seconds[eager].append(time.perf_counter() - start)
                keras.Model.compile = compile_as_asked
        traced, eager = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"| {size:,} | {steps} | {traced:.1f} | {eager:.1f} | {eager / traced:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

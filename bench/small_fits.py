"""Small fits, eager vs traced: when is tracing a training step worth it?

`train` fits two networks: the sentence encoder retrieval reads meaning with (from scratch only; a model built on a
base keeps the base's), then the transformer. A small run gives either a few steps, and tracing the step then costs
more than running every step op by op. For data of several sizes (the first N pairs of the data file) this times
each fit both ways, side by side in alternating rounds of one run, and prints the steps, the seconds of each and the
ratio; `sentence.EAGER_STEPS` and `train.EAGER_FIT_STEPS` are where eager stops paying.

- "sentence encoder": `fit_sentence_encoder` as `train` calls it (its epochs, batch 128).
- "transformer": the default network (4 layers, d_model 128) built by `train`'s `build` stage and fitted for one
  epoch in batches of 64, reading the question alone (the encoder input does not change a step's tracing).

    python bench/small_fits.py [--data CSV] [--rounds 2]

Data: ../shared/data/ChatbotData.csv when present, else the bundled data/korean_chat.csv.
"""

import argparse
import dataclasses
import math
import statistics
import tempfile
import time
from pathlib import Path

from common import DEFAULT_DATA

SENTENCE_SIZES = (30, 100, 300)  # pairs: 3, 9 and 24 steps of the bundled data's groups
TRANSFORMER_SIZES = (128, 512, 1920)  # pairs: 2, 8 and 30 steps of 64


def sentence_fit(pairs, eager: bool) -> tuple[int, float]:
    """(steps, seconds) of the sentence encoder's fit on `pairs`."""
    from chatbot.model import sentence
    from chatbot.tokenizer.subword import Tokenizer
    from chatbot.training.train import SENTENCE_EPOCHS

    texts, groups = sentence.answer_groups(pairs)
    tokenizer = Tokenizer.train(texts, min(4000, 50 + 4 * len(texts)))
    ids = tokenizer.encode(texts)
    members = sum(len(group) for group in groups if len(group) > 1)
    chosen = sentence.EAGER_STEPS
    sentence.EAGER_STEPS = math.inf if eager else 0  # whatever the fit would choose for this many steps
    try:
        start = time.perf_counter()
        sentence.fit_sentence_encoder(ids, groups, tokenizer.vocab_size, epochs=SENTENCE_EPOCHS)
        return math.ceil(members * SENTENCE_EPOCHS / 128), time.perf_counter() - start
    finally:
        sentence.EAGER_STEPS = chosen


def transformer_fit(pairs, eager: bool, folder: Path) -> tuple[int, float]:
    """(steps, seconds) of building and fitting the default network for one epoch of `pairs`."""
    import tensorflow as tf

    from chatbot.training import train
    from chatbot.config import ChatbotConfig

    config = ChatbotConfig()
    config = dataclasses.replace(config, context=dataclasses.replace(config.context, retrieved=0),
                                 data=dataclasses.replace(config.data, val_fraction=0.0),
                                 train=dataclasses.replace(config.train, epochs=1, repeats=1, batch_size=64))
    quiet = lambda *_: None  # noqa: E731
    run = train.start_run(pairs, config, folder / f"run-{time.monotonic_ns()}", base=None, resume=False,
                          overwrite=False, log=quiet)
    data = train.prepare_data(run, None, 1, quiet)
    start = time.perf_counter()
    built = train.build(data, tf.distribute.get_strategy(), None, run.state, quiet)
    built.model.run_eagerly = eager  # whatever `build` chose for this many steps
    built.model.fit(data.train_batches, epochs=1, verbose=0, shuffle=False)  # the dataset shuffles itself
    return int(data.train_batches.cardinality()), time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds (the machine is noisy)")
    args = parser.parse_args(argv)

    from chatbot.startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    from chatbot.model import sentence
    from chatbot.training import train
    from chatbot.data.pairs import load_pairs

    pairs, _ = load_pairs(args.data)
    folder = Path(tempfile.mkdtemp(prefix="small-fits-"))
    print(f"data: {args.data}; sentence.EAGER_STEPS = {sentence.EAGER_STEPS}, "
          f"train.EAGER_FIT_STEPS = {train.EAGER_FIT_STEPS}")
    print("| fit | pairs | steps | traced (s) | eager (s) | eager / traced |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [("sentence encoder", size, sentence_fit) for size in SENTENCE_SIZES]
    rows += [("transformer", size, lambda p, e: transformer_fit(p, e, folder)) for size in TRANSFORMER_SIZES]
    for name, size, fit in rows:
        seconds, steps = {True: [], False: []}, 0
        for _ in range(args.rounds):
            for eager in (False, True):
                steps, took = fit(pairs[:size], eager)
                seconds[eager].append(took)
        traced, eager = statistics.median(seconds[False]), statistics.median(seconds[True])
        print(f"| {name} | {size:,} | {steps} | {traced:.1f} | {eager:.1f} | {eager / traced:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

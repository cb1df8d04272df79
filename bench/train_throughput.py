"""Training throughput: the seed tutorial's recipe (every batch padded to max_length, a plain compiled
step) vs this package's (batches bucketed by length, its own 4,000-piece tokenizer).

All rows feed the same model the same pairs; the script times training steps of each, side by side
in alternating rounds of one run, after a warm-up epoch that traces (and compiles) every batch
shape, and prints non-pad target tokens per second and the ratios to the tutorial's recipe.

The "package" rows use the package's own tokenizer of 4,000 pieces (`train`'s default) instead of
the 8,000 of the other rows, so their model's output layer is half as wide: the first is `train`'s
defaults whole (bucketed batches of 64), the second adds 2,560-token batches (an option of
`make_dataset`, not `train`'s default). Their tokens are shorter, so tokens per second do not
compare across tokenizers: those rows are compared in question/answer pairs per second (an epoch's
time), which every row also prints.

    python bench/train_throughput.py [--data CSV] [--steps 40] [--batch-size 64]

Data: ../shared/data/ChatbotData.csv when present, else the bundled data/korean_chat.csv.
"""

import argparse
import itertools
import time

from common import DEFAULT_DATA, tokenized_pairs


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--steps", type=int, default=40, help="timed steps per pipeline and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (the machine is noisy)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--xla", action="store_true", help="also time the bucketed row with an XLA-compiled step "
                        "(slower on a CPU; its warm-up compiles every batch shape)")
    return parser.parse_args()


def main():
    args = parse_args()
    import keras
    import tensorflow as tf

    from chatbot.losses import MaskedAccuracy, MaskedSparseCrossEntropy, transformer_optimizer
    from chatbot.model import Transformer
    from chatbot.pipeline import make_dataset

    pairs, tokenizer, questions, answers = tokenized_pairs(args.data, 8000)
    _, own_tokenizer, own_questions, own_answers = tokenized_pairs(args.data, 4000)
    print(f"data: {args.data} ({len(pairs)} pairs), vocabulary {tokenizer.vocab_size} "
          f"(the package's own: {own_tokenizer.vocab_size}), batch {args.batch_size}")

    def steps_for(vocab_size):
        """(plain step, XLA step) training one new model of this vocabulary."""
        model = Transformer(vocab_size, max_length=args.max_length)
        model.compile(optimizer=transformer_optimizer(128), loss=MaskedSparseCrossEntropy(),
                      metrics=[MaskedAccuracy()])

        def train_step(inputs, targets):
            with tf.GradientTape() as tape:
                loss = model.loss(targets, model(inputs, training=True))
            model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                                model.trainable_variables))
            return loss

        return tf.function(train_step, reduce_retracing=True), tf.function(train_step, jit_compile=True)

    (plain, xla), (own_plain, _) = steps_for(tokenizer.vocab_size), steps_for(own_tokenizer.vocab_size)
    budget = args.batch_size * args.max_length  # the tutorial's padded batch, in tokens
    ids, own_ids = (questions, answers), (own_questions, own_answers)
    rows = {  # name: (bucketed, batch token budget, step, (question ids, answer ids))
        "tutorial: padded": (False, 0, plain, ids),
        "bucketed": (True, 0, plain, ids),
        f"bucketed, {budget}-token batches": (True, budget, plain, ids),
        **({"bucketed + XLA": (True, 0, xla, ids)} if args.xla else {}),
        "package: train's defaults": (True, 0, own_plain, own_ids),
        f"package, {budget}-token batches": (True, budget, own_plain, own_ids),
    }
    pipelines = {name: make_dataset(*data, max_length=args.max_length, batch_size=args.batch_size,
                                    bucketed=bucketed, batch_tokens=tokens)
                 for name, (bucketed, tokens, _, data) in rows.items()}
    epoch = max(int(data.cardinality()) for data in pipelines.values())
    batches = {name: iter(data.repeat()) for name, data in pipelines.items()}
    step_of = {name: step for name, (_, _, step, _) in rows.items()}

    def run(name, steps):
        tokens, count, start = 0, 0, time.perf_counter()
        for inputs, targets in itertools.islice(batches[name], steps):
            step_of[name](inputs, targets)
            tokens += int(tf.math.count_nonzero(targets))
            count += int(tf.shape(targets)[0])
        return tokens, count, time.perf_counter() - start

    for name in pipelines:  # warm up: one epoch traces (and compiles) every batch shape before timing
        run(name, epoch + 1)
    totals = {name: [0, 0, 0.0] for name in pipelines}
    for _ in range(args.rounds):
        for name in pipelines:
            for total, value in enumerate(run(name, args.steps)):
                totals[name][total] += value
    tokens, count, seconds = totals["tutorial: padded"]
    tutorial_tokens, tutorial_pairs = tokens / seconds, count / seconds
    for name, (tokens, count, seconds) in totals.items():
        # another tokenizer's tokens are not the same unit: those rows' tokens/s get no ratio
        token_ratio = "   -  " if rows[name][3] is own_ids else f"{tokens / seconds / tutorial_tokens:5.2f}x"
        print(f"{name:30s} {tokens / seconds:6.0f} non-pad target tokens/s {token_ratio} | {count / seconds:5.1f} "
              f"pairs/s {count / seconds / tutorial_pairs:5.2f}x the tutorial  ({tokens} tokens, {count} pairs "
              f"in {seconds:.1f} s)")
    keras.backend.clear_session()


if __name__ == "__main__":
    main()

"""Training throughput: the seed tutorial's recipe (every batch padded to max_length, a plain compiled
step) vs this package's (batches grouped by length, its own 4,000-piece tokenizer, `train`'s defaults).

All rows train the same 4-layer d_model-128 model on the same pairs in batches of the same size; the
script times training steps of each, side by side in alternating rounds of one run, after a warm-up
epoch that traces every batch shape, and prints non-pad target tokens and question/answer pairs per
second, with the ratios to the tutorial's recipe.

Rows:
- "tutorial: padded": the seed tutorial's recipe (8,000 pieces, dropout 0.1, padded batches, and its
  `tf.keras.optimizers.Adam`, which is Keras 3's Adam on today's TensorFlow).
- "bucketed": the same model, tokens and optimizer in this package's length-grouped batches.
- "package, question only": `train`'s model settings (4,000 pieces, dropout 0, the package's fused Adam)
  on the tutorial's input.
- "package: train's defaults": as `train` runs by default: the encoder also reads the question's tone
  and the answer of its nearest training question, so each pair costs more than in the other rows.

The package's tokens are not the tutorial's unit (another tokenizer), so its rows compare in pairs
per second (an epoch's time).

    python bench/train_throughput.py [--data CSV] [--steps 40] [--batch-size 64]

Data: ../shared/data/ChatbotData.csv when present, else the bundled data/korean_chat.csv.
"""

import argparse
import dataclasses
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

    from chatbot.config import ChatbotConfig, ModelConfig, TrainConfig
    from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy
    from chatbot.model.transformer import Transformer
    from chatbot.training.optimizer import WarmupSchedule, transformer_optimizer
    from chatbot.training.batches import make_dataset
    from chatbot.retrieval.retriever import Retriever
    from chatbot.training.neighbours import context_for, training_batches

    pairs, tokenizer, questions, answers = tokenized_pairs(args.data, 8000)
    _, own_tokenizer, own_questions, own_answers = tokenized_pairs(args.data, 4000)
    print(f"data: {args.data} ({len(pairs)} pairs), vocabulary {tokenizer.vocab_size} "
          f"(the package's own: {own_tokenizer.vocab_size}), batch {args.batch_size}")

    def tutorial_optimizer():
        return keras.optimizers.Adam(WarmupSchedule(128), beta_1=0.9, beta_2=0.98, epsilon=1e-9)

    def steps_for(config, optimizer):
        """(plain step, XLA step) training one new model of this `ModelConfig` with this optimizer."""
        model = Transformer.from_config_dataclass(config)
        model.compile(optimizer=optimizer(), loss=MaskedSparseCrossEntropy(),
                      metrics=[MaskedAccuracy()])

        def train_step(inputs, targets):
            with tf.GradientTape() as tape:
                loss = model.loss(targets, model(inputs, training=True))
            model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables),
                                                model.trainable_variables))
            return loss

        return tf.function(train_step, reduce_retracing=True), tf.function(train_step, jit_compile=True)

    tutorial_model = ModelConfig(vocab_size=tokenizer.vocab_size, dropout=0.1, max_length=args.max_length)
    package = context_for(ChatbotConfig(model=ModelConfig(vocab_size=own_tokenizer.vocab_size,
                                                          max_length=args.max_length),
                                        train=TrainConfig(batch_size=args.batch_size)), pairs)
    plain, xla = steps_for(tutorial_model, tutorial_optimizer)
    own_plain, _ = steps_for(dataclasses.replace(package.model, encoder_length=0), lambda: transformer_optimizer(128))
    defaults_step, _ = steps_for(package.model, lambda: transformer_optimizer(128))

    def dataset(data, bucketed):
        return make_dataset(*data, max_length=args.max_length, batch_size=args.batch_size, bucketed=bucketed)

    ids, own_ids = (questions, answers), (own_questions, own_answers)
    rows = {  # name: (step, batches, the package's tokenizer)
        "tutorial: padded": (plain, dataset(ids, False), False),
        "bucketed": (plain, dataset(ids, True), False),
        **({"bucketed + XLA": (xla, dataset(ids, True), False)} if args.xla else {}),
        "package, question only": (own_plain, dataset(own_ids, True), True),
        "package: train's defaults": (defaults_step, training_batches(own_tokenizer, pairs, package, True,
                                                                      Retriever(pairs), True)[0], True),
    }
    pipelines = {name: data for name, (_, data, _) in rows.items()}
    epoch = max(int(data.cardinality()) for data in pipelines.values())
    batches = {name: iter(data.repeat()) for name, data in pipelines.items()}
    step_of = {name: step for name, (step, _, _) in rows.items()}

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
        token_ratio = "   -  " if rows[name][2] else f"{tokens / seconds / tutorial_tokens:5.2f}x"
        print(f"{name:26s} {tokens / seconds:6.0f} non-pad target tokens/s {token_ratio} | {count / seconds:5.1f} "
              f"pairs/s {count / seconds / tutorial_pairs:5.2f}x the tutorial  ({tokens} tokens, {count} pairs "
              f"in {seconds:.1f} s)")
    keras.backend.clear_session()


if __name__ == "__main__":
    main()

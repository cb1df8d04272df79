"""Training speed by numeric precision: float32 vs mixed float16 vs mixed bfloat16, XLA on and off.

Every setting trains its own copy of the same model (same seed) on the same bucketed batches, side
by side in one run, in alternating rounds. The script prints non-pad target tokens per second, the
ratio to the first setting, and the mean training loss of each round: mixed precision has to
train as well as float32, not only faster.

    python bench/train_precision.py [--data CSV] [--batch-size 64] [--steps 200]

Meant for a GPU, where `train` turns mixed precision and XLA on by default; CPU figures say little
about a GPU. Only full batches are timed, and every batch shape compiles once per setting before
timing (20-30 s per shape on an H100 under JAX): `--shapes N` keeps the N most common.

Batches come from the package's tf.data pipeline. `--save-batches F.npz` writes them and
`--batches F.npz` reads them back, so the timing also runs on another Keras 3 backend, e.g.
`KERAS_BACKEND=jax` on a GPU machine without TensorFlow (JAX always compiles with XLA).
"""

import argparse
import collections
import itertools
import time

import numpy as np

from common import DEFAULT_DATA, tokenized_pairs


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--batches", help="read pre-tokenized batches from this .npz instead of --data")
    parser.add_argument("--save-batches", help="write the batches to this .npz and stop")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-length", type=int, default=40)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per setting and round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (the machine is noisy)")
    parser.add_argument("--precisions", default="float32,mixed_float16,mixed_bfloat16",
                        help="comma-separated Keras dtype policies")
    parser.add_argument("--shapes", type=int, default=0,
                        help="keep only batches of the N most common shapes (fewer compilations; 0 keeps all)")
    parser.add_argument("--xla", default=None, help="on, off or on,off (default: on,off on TensorFlow, on elsewhere)")
    return parser.parse_args()


def make_batches(args):
    """One epoch of the training pipeline's batches as numpy arrays, plus the vocabulary size."""
    from chatbot.training.batches import make_dataset

    pairs, tokenizer, questions, answers = tokenized_pairs(args.data, args.vocab_size)
    dataset = make_dataset(questions, answers, max_length=args.max_length, batch_size=args.batch_size)
    batches = [((enc.numpy(), dec.numpy()), tgt.numpy()) for (enc, dec), tgt in dataset]
    print(f"data: {args.data} ({len(pairs)} pairs), vocabulary {tokenizer.vocab_size}, "
          f"{len(batches)} batches of {args.batch_size}")
    return batches, tokenizer.vocab_size


def save_batches(path, batches, vocab_size):
    arrays = {"vocab_size": np.array(vocab_size)}
    for i, ((enc, dec), tgt) in enumerate(batches):
        arrays[f"enc{i}"], arrays[f"dec{i}"], arrays[f"tgt{i}"] = enc, dec, tgt
    np.savez_compressed(path, **arrays)


def load_batches(path):
    arrays = np.load(path)
    count = sum(1 for key in arrays.files if key.startswith("enc"))
    batches = [((arrays[f"enc{i}"], arrays[f"dec{i}"]), arrays[f"tgt{i}"]) for i in range(count)]
    return batches, int(arrays["vocab_size"])


def main():
    args = parse_args()
    if args.batches:
        batches, vocab_size = load_batches(args.batches)
        print(f"batches: {args.batches} ({len(batches)} batches)")
    else:
        batches, vocab_size = make_batches(args)
    # Only full batches: every distinct shape is one more compilation per setting under XLA.
    full = max(len(targets) for _, targets in batches)
    batches = [b for b in batches if len(b[1]) == full]
    if args.shapes:
        counts = collections.Counter(b[1].shape for b in batches)
        kept = {shape for shape, _ in counts.most_common(args.shapes)}
        batches = [b for b in batches if b[1].shape in kept]
    if args.save_batches:
        save_batches(args.save_batches, batches, vocab_size)
        print(f"wrote {args.save_batches}")
        return

    import keras

    from chatbot.training.losses import MaskedSparseCrossEntropy
    from chatbot.model.transformer import Transformer
    from chatbot.training.optimizer import transformer_optimizer

    backend = keras.backend.backend()
    xla_modes = args.xla or ("on,off" if backend == "tensorflow" else "on")
    settings = [(precision, xla == "on") for precision in args.precisions.split(",") for xla in xla_modes.split(",")]
    print(f"backend: {backend}; devices: {device_names(backend)}")

    # One batch of every shape, so each setting compiles all its step functions before timing.
    warmup = list({(b[0][0].shape, b[0][1].shape): b for b in batches}.values())
    models, streams = {}, {}
    for precision, xla in settings:
        print(f"compiling {precision}, XLA {'on' if xla else 'off'}: {len(warmup)} batch shapes", flush=True)
        keras.utils.set_random_seed(0)
        model = Transformer(vocab_size, max_length=args.max_length, dtype=precision)
        model.compile(optimizer=transformer_optimizer(128), loss=MaskedSparseCrossEntropy(), jit_compile=xla)
        for (inputs, targets) in warmup:
            start = time.perf_counter()
            model.train_on_batch(inputs, targets)
            print(f"  {targets.shape}: {time.perf_counter() - start:.1f} s", flush=True)
        models[precision, xla] = model
        streams[precision, xla] = itertools.cycle(batches)

    tokens = {key: 0 for key in settings}
    seconds = {key: 0.0 for key in settings}
    losses = {}
    for round_number in range(args.rounds):
        for key in settings:
            chunk = list(itertools.islice(streams[key], args.steps))
            start = time.perf_counter()
            chunk_losses = [float(models[key].train_on_batch(inputs, targets)) for inputs, targets in chunk]
            seconds[key] += time.perf_counter() - start
            tokens[key] += sum(int(np.count_nonzero(targets)) for _, targets in chunk)
            losses[key] = float(np.mean(chunk_losses))
        # A table after every round, so a run cut short by a time limit still reports.
        print(f"after round {round_number + 1}/{args.rounds}:")
        print_table(settings, tokens, seconds, losses)


def print_table(settings, tokens, seconds, losses):
    base = tokens[settings[0]] / seconds[settings[0]]
    print(f"{'precision':16s} {'XLA':4s} {'tokens/s':>10s} {'ratio':>6s} {'round loss':>11s}", flush=True)
    for key in settings:
        rate = tokens[key] / seconds[key]
        print(f"{key[0]:16s} {'on' if key[1] else 'off':4s} {rate:10.0f} {rate / base:5.2f}x {losses[key]:11.4f}",
              flush=True)


def device_names(backend):
    if backend == "jax":
        import jax
        return ", ".join(str(d) for d in jax.devices())
    if backend == "tensorflow":
        import tensorflow as tf
        return ", ".join(d.name for d in tf.config.list_logical_devices()) or "none"
    return "?"


if __name__ == "__main__":
    main()

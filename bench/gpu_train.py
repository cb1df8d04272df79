"""The default recipe trained on a GPU through Keras' JAX backend, in three steps across two machines.

`prepare` (here, with TensorFlow) composes the recipe's training and validation batches exactly as `train`
does (tokenizer, retrieved neighbours, tone, teacher forcing), pads them to fixed widths and writes them, with
the settings, the vocabulary and the retrieval index, to one compact `.npz`. `train` (on a machine with JAX and
Keras, no TensorFlow needed) builds the same `Transformer` under `KERAS_BACKEND=jax`, trains it with XLA (and
bf16 mixed precision on a GPU), prints seconds per epoch, pairs per second and the validation loss of every
epoch, and writes the weights of the epoch with the lowest validation loss. `chat` (back here) loads those
weights into the TensorFlow model and answers a few messages with the package's own decoding.

    python bench/gpu_train.py prepare --out recipe.npz                 # the README's default-model recipe
    python bench/gpu_train.py train --arrays recipe.npz --epochs 30 --out gpu.weights.h5   # KERAS_BACKEND=jax
    python bench/gpu_train.py chat --arrays recipe.npz --weights gpu.weights.h5

On a GPU machine with only JAX: carry keras, namex and optree as wheels and this repository (BENCHMARKS.md,
"Training on a GPU through JAX", has the command). Without a GPU, `train` runs on the CPU with the same code.
"""

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

from common import ROOT, training_file

RECIPE = ["data/korean_chat.csv", "data/chat_work_school.csv", "data/chat_relationships.csv",
          "data/chat_health_food.csv", "data/chat_money_home.csv", "data/chat_hobbies_holidays.csv",
          "data/chat_smalltalk_bot.csv", "data/ChatbotData.csv"]
PROBES = ["오늘 너무 피곤해", "배고파", "헤어지고 밥이 안 넘어가", "주말에 뭐 하지?", "표창 받았어"]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    prepare = steps.add_parser("prepare", help="write the recipe's padded batches, settings and vocabulary (TensorFlow)")
    prepare.add_argument("--data", nargs="+", default=RECIPE, help="CSV files (default: the default model's recipe)")
    prepare.add_argument("--epochs", type=int, default=30, help="recorded in the settings (default: %(default)s)")
    prepare.add_argument("--out", type=Path, required=True, help="the .npz to write")
    train = steps.add_parser("train", help="train on the arrays under Keras' JAX backend (no TensorFlow needed)")
    train.add_argument("--arrays", type=Path, required=True)
    train.add_argument("--epochs", type=int, default=None, help="default: the recipe's")
    train.add_argument("--backend", default="jax", choices=("jax", "torch", "tensorflow"))
    train.add_argument("--precision", default="auto", choices=("auto", "float32", "mixed_bfloat16"),
                       help="auto: mixed_bfloat16 on a GPU, float32 on a CPU")
    train.add_argument("--out", type=Path, required=True, help="weights of the best epoch (.weights.h5)")
    chat = steps.add_parser("chat", help="load the weights into the TensorFlow model and answer (TensorFlow)")
    chat.add_argument("--arrays", type=Path, required=True)
    chat.add_argument("--weights", type=Path, required=True)
    chat.add_argument("messages", nargs="*", default=PROBES)
    args = parser.parse_args(argv)
    for name in ("arrays", "weights"):
        if getattr(args, name, None) is not None and not getattr(args, name).is_file():
            parser.error(f"--{name} {getattr(args, name)}: no such file")
    return args


def prepare(args) -> None:
    import numpy as np
    import tensorflow as tf

    from chatbot.config import ChatbotConfig, DataConfig, TrainConfig
    from chatbot.training.neighbours import context_for, training_batches
    from chatbot.data.pairs import load_pairs, merge_pairs, split_by_question
    from chatbot.retrieval.retriever import Retriever, index_json
    from chatbot.training.sizing import fitted_to_data
    from chatbot.tokenizer.subword import Tokenizer

    pairs, _ = merge_pairs([load_pairs(training_file(path))[0] for path in args.data])
    config = ChatbotConfig(data=DataConfig(paths=tuple(args.data)), train=TrainConfig(epochs=args.epochs))
    config = context_for(fitted_to_data(config, len(pairs)), pairs)
    train_pairs, val_pairs = split_by_question(pairs, config.data.val_fraction, config.data.seed)
    tokenizer = Tokenizer.train([p.question for p in pairs] + [p.answer for p in pairs], config.tokenizer.vocab_size)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size))
    retriever = Retriever(train_pairs) if config.context.retrieved else None
    widths = (config.model.encoder_length, config.model.max_length)

    def arrays(batches):
        rows = {"encoder": [], "decoder": [], "targets": []}
        for (encoder, decoder), targets in batches:
            for name, tensor, width in (("encoder", encoder, widths[0]), ("decoder", decoder, widths[1]),
                                        ("targets", targets, widths[1])):
                rows[name].append(tf.pad(tensor, [[0, 0], [0, width - tensor.shape[1]]]).numpy())
        return {name: np.concatenate(parts).astype("int32") for name, parts in rows.items()}

    started = time.perf_counter()
    train = arrays(training_batches(tokenizer, train_pairs * config.train.repeats, config, True, retriever, True)[0])
    val = arrays(training_batches(tokenizer, val_pairs, config, False, retriever)[0])
    np.savez_compressed(args.out, **train, **{f"val_{name}": value for name, value in val.items()},
                        config=np.frombuffer(config.to_json().encode(), np.uint8),
                        tokenizer=np.frombuffer(tokenizer.model_proto, np.uint8),
                        index=np.frombuffer(index_json(train_pairs + val_pairs), np.uint8))
    print(f"wrote {args.out}: {len(train['encoder']):,} training rows, {len(val['encoder']):,} validation rows, "
          f"widths {widths}, {args.out.stat().st_size / 2**20:.1f} MiB in {time.perf_counter() - started:.0f} s")


def train(args) -> None:
    os.environ["KERAS_BACKEND"] = args.backend  # before Keras is imported
    import keras
    import numpy as np

    from chatbot.config import ChatbotConfig
    from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy
    from chatbot.model.transformer import Transformer
    from chatbot.training.optimizer import transformer_optimizer

    data = np.load(args.arrays)
    config = ChatbotConfig.from_json(data["config"].tobytes().decode())
    gpu = bool(_gpus(args.backend))
    precision = args.precision if args.precision != "auto" else ("mixed_bfloat16" if gpu else "float32")
    epochs = args.epochs or config.train.epochs
    keras.utils.set_random_seed(config.train.seed)
    model = Transformer.from_config_dataclass(config.model, dtype=precision)
    model.compile(optimizer=transformer_optimizer(config.model.d_model, config.train.warmup_steps,
                                                  config.train.peak_learning_rate),
                  loss=MaskedSparseCrossEntropy(config.train.label_smoothing), metrics=[MaskedAccuracy()],
                  jit_compile=True)
    train_x, val_x = (data["encoder"], data["decoder"]), (data["val_encoder"], data["val_decoder"])
    rows = len(data["encoder"])
    print(f"backend {keras.backend.backend()} on {'GPU: ' + _gpus(args.backend)[0] if gpu else 'CPU'}; {precision}; "
          f"{rows:,} training rows of batch {config.train.batch_size}, {epochs} epochs", flush=True)

    class Report(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.best = float("inf")

        def on_epoch_begin(self, epoch, logs=None):
            self.started = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            seconds = time.perf_counter() - self.started
            print(f"epoch {epoch + 1}: {seconds:.1f} s, {rows / seconds:,.0f} pairs/s, loss {logs['loss']:.4f}, "
                  f"val_loss {logs['val_loss']:.4f}", flush=True)
            if logs["val_loss"] < self.best:
                self.best = logs["val_loss"]
                model.save_weights(args.out)

    started, report = time.perf_counter(), Report()
    model.fit(train_x, data["targets"], batch_size=config.train.batch_size, epochs=epochs, shuffle=True,
              validation_data=(val_x, data["val_targets"]), callbacks=[report], verbose=0)
    print(f"all {epochs} epochs in {time.perf_counter() - started:.0f} s (the first includes XLA's compilation); "
          f"best val_loss {report.best:.4f}; weights: {args.out}")


def _gpus(backend: str) -> list[str]:
    if backend == "jax":
        import jax

        return [str(device) for device in jax.devices() if device.platform == "gpu"]
    if backend == "torch":
        import torch

        return [torch.cuda.get_device_name(0)] if torch.cuda.is_available() else []
    import tensorflow as tf

    return [device.name for device in tf.config.list_physical_devices("GPU")]


def chat(args) -> None:
    import numpy as np

    from chatbot.config import ChatbotConfig
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.model.transformer import Transformer
    from chatbot.retrieval.retriever import Retriever
    from chatbot.tokenizer.subword import Tokenizer

    data = np.load(args.arrays)
    config = ChatbotConfig.from_json(data["config"].tobytes().decode())
    model = Transformer.from_config_dataclass(config.model)
    model((data["val_encoder"][:1], data["val_decoder"][:1]))
    model.load_weights(args.weights)
    retriever = Retriever.from_json(data["index"].tobytes()) if config.context.retrieved else None
    bot = Chatbot(model, Tokenizer(data["tokenizer"].tobytes()), config, retriever=retriever, compilation="graph")
    for message in args.messages:
        print(f"{message} -> {bot.reply(message)}")


def main(argv=None) -> int:
    args = parse_args(argv)
    {"prepare": prepare, "train": train, "chat": chat}[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

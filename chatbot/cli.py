"""Command line: `python -m chatbot {train,chat,eval,export,download}`.

Owns: argparse, turning user mistakes into one `error: ...` line and exit status 2, and
nothing else: every subcommand calls into the package (the chat conversation is `chatbot.terminal`).
TensorFlow is imported only inside the handlers, so `--help` is instant.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from pathlib import Path

from chatbot import terminal
from chatbot.artifacts import ArtifactError, check_model_dir, check_writable
from chatbot.config import (MAX_RETRIEVED, SELECTIONS, STRATEGIES, TONES, ChatbotConfig, ContextConfig, DataConfig,
                            GenerationConfig, ModelConfig, TokenizerConfig, TrainConfig, __version__)
from chatbot.data import DataError
from chatbot.schedule import MIN_STEPS_PER_EPOCH
from chatbot.startup import import_tensorflow_quietly
from chatbot.download import DownloadError, download_chatbot_data
from chatbot.terminal import UserError

DEFAULT_MODEL = "models/default"
USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one `error: ...` line and status 2, like every other user mistake."""

    def error(self, message):
        self.exit(USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


def _add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per GenerationConfig field: --max-new-tokens for max_new_tokens, and so on; and --tone."""
    group = parser.add_argument_group("decoding")
    group.add_argument("--tone", choices=TONES, help="answer in this tone (for models trained on a label column: "
                       "0 everyday, 1 sad, 2 love); default: none asked")
    types = typing.get_type_hints(GenerationConfig)
    for option in dataclasses.fields(GenerationConfig):
        kind = int if option.name == "seed" else types[option.name]
        choices = STRATEGIES if option.name == "strategy" else None
        group.add_argument(f"--{option.name.replace('_', '-')}", type=kind, default=option.default, choices=choices,
                           help=option.metadata.get("help"))


def _decoding(args) -> dict:
    """The keyword arguments of `Chatbot.reply`: the decoding options, checked, and the tone."""
    decoding = {option.name: getattr(args, option.name) for option in dataclasses.fields(GenerationConfig)}
    try:
        GenerationConfig(**decoding)
    except ValueError as error:
        raise UserError(str(error)) from None
    return {**decoding, "tone": args.tone}


def program_name() -> str:
    """How the user started us: `chatbot` (the installed command) or `python -m chatbot`."""
    return "chatbot" if Path(sys.argv[0]).name == "chatbot" else "python -m chatbot"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=program_name(), description="Korean transformer chatbot (한국어 트랜스포머 챗봇).")
    parser.add_argument("--version", action="version", version=f"chatbot {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    m, t = ModelConfig(), TrainConfig()
    AUTO = "chosen from the data's size when unset"  # noqa: N806
    train = commands.add_parser("train", help="train a chatbot on a Q&A CSV",
                                description="Train a chatbot on a Q&A CSV (columns Q,A[,label]) and write a model directory.")
    train.add_argument("--data", required=True, action="append", metavar="SOURCE",
                       help="CSV with question/answer columns (Q,A or question,answer; label optional), or a TFDS "
                            "dataset: tfds:korean_chatbot_data (the public ChatbotData); repeat to train on several")
    train.add_argument("--out", required=True, help="model directory to create")
    train.add_argument("--overwrite", action="store_true", help="replace --out if it exists (only once training succeeded)")
    train.add_argument("--resume", action="store_true", help="continue an interrupted run of the same --out")
    train.add_argument("--epochs", type=int, help=f"passes over the data ({AUTO}: 50 for 2,000 pairs or more, else 40)")
    train.add_argument("--batch-size", type=int, help=f"pairs per step ({AUTO}: 16, 32 or 64)")
    train.add_argument("--repeats", type=int, help=f"each pair this many times an epoch ({AUTO}: at least "
                                                   f"{MIN_STEPS_PER_EPOCH} steps an epoch)")
    train.add_argument("--max-length", type=int, default=m.max_length, help="longest question/answer in tokens")
    train.add_argument("--vocab-size", type=int, default=TokenizerConfig().vocab_size, help="subword vocabulary target")
    train.add_argument("--num-layers", type=int, default=m.num_layers)
    train.add_argument("--d-model", type=int, default=m.d_model)
    train.add_argument("--num-heads", type=int, default=m.num_heads)
    train.add_argument("--dff", type=int, default=m.dff, help="feed-forward width")
    train.add_argument("--dropout", type=float, default=m.dropout)
    train.add_argument("--shared-embeddings", action="store_true",
                       help="the output layer is the decoder's token embedding, transposed (fewer weights)")
    train.add_argument("--copy-head", action="store_true",
                       help="a pointer-generator output that may copy the retrieved answers token by token")
    train.add_argument("--warmup-steps", type=int,
                       help=f"steps of rising learning rate ({AUTO}: 4,000, or a fifth of a shorter run)")
    train.add_argument("--peak-learning-rate", type=float, default=t.peak_learning_rate, metavar="LR",
                       help="where the warmup schedule peaks (default: %(default)s; unset: the paper's "
                            "d_model^-0.5 * warmup^-0.5)")
    train.add_argument("--label-smoothing", type=float, default=t.label_smoothing)
    c = ContextConfig()
    train.add_argument("--retrieved", type=int, default=c.retrieved, metavar="K",
                       help=f"answers of the K nearest training questions the model reads after the question "
                            f"(0-{MAX_RETRIEVED}; 0: the question alone; default: %(default)s)")
    train.add_argument("--neighbour-questions", action="store_true",
                       help="show each retrieved answer with the question it answered, so the encoder can judge "
                            "whether it fits (an option: BENCHMARKS.md has how it measured)")
    train.add_argument("--no-tone", dest="tone", action="store_false",
                       help="ignore the label column (by default it becomes a tone the model learns and `chat "
                            "--tone` asks for)")
    train.add_argument("--val-fraction", type=float,
                       help=f"share of questions held out to choose the epoch ({AUTO}: 0.1, or 0 under 1,000 pairs)")
    train.add_argument("--seed", type=int, default=t.seed)
    train.add_argument("--select", choices=SELECTIONS, default=t.select,
                       help="which epoch to keep: chrf = best replies to the validation questions (chrF), "
                            "loss = lowest validation loss, last = the last one (default: %(default)s)")
    train.add_argument("--early-stopping", type=int, default=0, metavar="PATIENCE",
                       help="stop after this many epochs without improvement of the --select metric (0: off)")
    train.add_argument("--strategy", choices=["auto", "mirrored", "multi-worker"], default="auto",
                       help="tf.distribute: mirrored = all local GPUs; multi-worker = machines in TF_CONFIG")
    train.add_argument("--no-mixed-precision", dest="mixed_precision", action="store_false", default=None,
                       help="train in float32 even on a GPU")
    train.add_argument("--no-xla", dest="xla", action="store_false", default=None, help="do not compile with XLA")
    train.set_defaults(handler=run_train)

    chat = commands.add_parser("chat", help="talk to a model in the terminal",
                               description="Chat with a model: a REPL, one --question, or one reply per line of piped stdin.")
    chat.add_argument("--model", default=DEFAULT_MODEL, help=f"model directory (default: {DEFAULT_MODEL})")
    chat.add_argument("--question", "-q", help="answer this one question and exit")
    _add_decoding_flags(chat)
    chat.set_defaults(handler=run_chat)

    evaluate = commands.add_parser("eval", help="measure a model on held-out Q&A pairs (JSON metrics)",
                                   description="Answer every question of a Q&A CSV (use questions the model never "
                                               "saw) and print JSON: loss, perplexity, chrF, BLEU, distinct-n, ...")
    evaluate.add_argument("--model", default=DEFAULT_MODEL, help=f"model directory (default: {DEFAULT_MODEL})")
    evaluate.add_argument("--data", required=True, metavar="CSV", help="Q&A CSV to evaluate on")
    evaluate.add_argument("--replies", metavar="OUT.csv", help="also write Q,A,reply rows to this CSV")
    evaluate.add_argument("--overwrite", action="store_true", help="replace an existing --replies file")
    evaluate.add_argument("--latency-sample", type=int, default=50, metavar="N",
                          help="time this many single replies for ms_per_reply (0: skip; default: %(default)s)")
    _add_decoding_flags(evaluate)
    evaluate.set_defaults(handler=run_eval)

    export = commands.add_parser("export", help="write a string-to-string TensorFlow SavedModel",
                                 description="Export a model as a SavedModel whose serving_default maps questions to replies.")
    export.add_argument("--model", default=DEFAULT_MODEL)
    export.add_argument("--out", required=True, help="SavedModel directory to create")
    export.add_argument("--overwrite", action="store_true")
    export.set_defaults(handler=run_export)

    download = commands.add_parser("download", help="fetch the public ChatbotData.csv (songys/Chatbot_data, MIT)",
                                   description="Download ChatbotData.csv, verify its SHA-256 and write it atomically.")
    download.add_argument("--out", default="data/ChatbotData.csv", help="where to write it (default: %(default)s)")
    download.add_argument("--overwrite", action="store_true", help="replace an existing file at --out")
    download.add_argument("--url", help="fetch from here instead, e.g. file:///media/usb/ChatbotData.csv for a copy "
                          "brought from a machine with internet (the checksum is still checked)")
    download.add_argument("--sha256", metavar="HEX", help="expect this SHA-256 instead of the pinned one "
                          "(for a newer upstream file you have checked)")
    download.set_defaults(handler=run_download)
    return parser


def run_train(args) -> None:
    role = strategy = None
    if args.strategy == "multi-worker":  # before any TensorFlow op: collective ops are set up at start
        from chatbot.cluster import multi_worker_strategy, read_tf_config

        try:
            role = read_tf_config(os.environ)
        except ValueError as error:
            raise UserError(str(error)) from None
        strategy = multi_worker_strategy()
    try:
        config = ChatbotConfig(
            model=ModelConfig(num_layers=args.num_layers, d_model=args.d_model, num_heads=args.num_heads,
                              dff=args.dff, dropout=args.dropout, max_length=args.max_length,
                              shared_embeddings=args.shared_embeddings, copy_head=args.copy_head),
            tokenizer=TokenizerConfig(vocab_size=args.vocab_size),
            context=ContextConfig(retrieved=args.retrieved, tone=args.tone, questions=args.neighbour_questions),
            data=DataConfig(paths=tuple(map(str, args.data)), val_fraction=args.val_fraction, seed=args.seed),
            train=TrainConfig(epochs=args.epochs, batch_size=args.batch_size, warmup_steps=args.warmup_steps,
                              repeats=args.repeats, peak_learning_rate=args.peak_learning_rate, select=args.select,
                              label_smoothing=args.label_smoothing, early_stopping=args.early_stopping,
                              mixed_precision=args.mixed_precision, xla=args.xla, strategy=args.strategy,
                              seed=args.seed))
    except ValueError as error:
        raise UserError(str(error)) from None
    if args.vocab_size < 16:
        raise UserError("--vocab-size must be at least 16")
    from chatbot.cluster import worker_out_dir

    final = Path(args.out)
    out = worker_out_dir(final, role)  # only the chief writes --out
    if out == final and out.exists() and not args.overwrite and not args.resume:  # a resume may find it saved
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    check_writable(out)
    from chatbot.datasets import load_sources

    pairs = load_sources(args.data, log=lambda line: print(line, flush=True))  # CSVs before TensorFlow loads
    from chatbot.tokenizer import VocabularyError
    from chatbot.train import train

    try:
        train(pairs, config, out, resume=args.resume, overwrite=args.overwrite or out != final, strategy=strategy)
    except VocabularyError as error:
        raise UserError(f"--vocab-size {args.vocab_size}: {error}") from None
    if out != final:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        print(f"worker {role.index} done: the chief saves the model at its --out")
        return
    print(f"saved: {out}\ntry it: {program_name()} chat --model {out}")


def run_chat(args) -> None:
    decoding = _decoding(args)
    if args.question is None:  # a conversation or piped lines: each graph is traced once and reused
        terminal.chat(args.model, None, decoding)
        return
    import tensorflow as tf

    # One reply runs its decoding ops once per token: eagerly that takes about a second, while tracing and
    # optimising the graph first costs 3-5 s on two cores. The reply is the same.
    eager = tf.config.functions_run_eagerly()
    tf.config.run_functions_eagerly(True)
    try:
        terminal.chat(args.model, args.question, decoding)
    finally:
        tf.config.run_functions_eagerly(eager)


def run_eval(args) -> None:
    import json

    from chatbot.data import load_pairs

    decoding = _decoding(args)
    if args.replies and Path(args.replies).exists() and not args.overwrite:
        raise UserError(f"{args.replies} already exists; choose another --replies or pass --overwrite")
    if args.latency_sample < 0:
        raise UserError("--latency-sample must be 0 or more")
    check_model_dir(args.model)
    pairs, _ = load_pairs(args.data)
    from chatbot.evaluate import evaluate
    from chatbot.generate import Chatbot

    result = evaluate(Chatbot.load(args.model), pairs, latency_sample=args.latency_sample, replies_out=args.replies,
                      **decoding)
    print(json.dumps({"model": str(args.model), "data": str(args.data), **result}, ensure_ascii=False, indent=2))


def run_export(args) -> None:
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    check_writable(out)
    check_model_dir(args.model)
    from chatbot.export import export_saved_model

    export_saved_model(args.model, out, overwrite=args.overwrite)
    print(f"saved: {out} (serving_default: strings 'questions' -> strings 'replies')")


def run_download(args) -> None:
    path = download_chatbot_data(args.out, overwrite=args.overwrite, url=args.url, sha256=args.sha256)
    print(f"saved: {path}\ntrain on it: {program_name()} train --data {path} --out models/chatbotdata")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command in ("train", "chat", "eval", "export"):
            import_tensorflow_quietly(find_devices=getattr(args, "strategy", "") != "multi-worker")
        args.handler(args)
    except (UserError, DataError, ArtifactError, DownloadError) as error:
        print(f"error: {error}", file=sys.stderr)
        return USER_ERROR
    except OSError as error:  # the file system said no (permissions, a full disk, a name too long): one line
        where = f": {error.filename}" if error.filename else ""
        print(f"error: {error.strerror or error}{where}", file=sys.stderr)
        return USER_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0

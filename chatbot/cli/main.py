"""Command line: `python -m chatbot {train,chat,eval,export,download}`.

Owns: argparse, turning user mistakes into one `error: ...` line and exit status 2, and
nothing else: every subcommand calls into the package (the chat conversation is `chatbot.cli.terminal`).
TensorFlow is loaded only inside the handlers, once each has checked what it can (seconds of loading): `--help`
is instant, and so is the error line for a mistake.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import typing
from pathlib import Path

from chatbot.cli import terminal
from chatbot.artifacts import (ArtifactError, check_model_dir, check_replaceable, check_writable, is_export,
                               is_model_dir, is_own_model_dir)
from chatbot.config import (RETRIEVAL_WEIGHTS, TONES, ChatbotConfig, ContextConfig, DataConfig, GenerationConfig,
                            ModelConfig, RetrievalConfig, TokenizerConfig, TrainConfig, __version__)
from chatbot.data.pairs import DataError
from chatbot.training.sizing import WHEN_UNSET
from chatbot.startup import import_tensorflow_quietly
from chatbot.data.download import DownloadError, download_chatbot_data
from chatbot.cli.terminal import UserError

DEFAULT_MODEL = "models/default"
USER_ERROR = 2


class Parser(argparse.ArgumentParser):
    """argparse whose mistakes are one `error: ...` line and status 2, like every other user mistake."""

    def error(self, message):
        self.exit(USER_ERROR, f"error: {message} (see {self.prog} --help)\n")


def _add_config_flags(group, section: type, unset: dict[str, str] | None = None) -> None:
    """A flag per field of the dataclass `section` that has a `help`: --d-model for d_model, and so on (or
    the field's `flag`, `metavar` and `choices`). A field False by default is turned on by --<name>, one True
    or None (decided when training) by default is turned off by --no-<name>. The help of a field named in
    `unset` says what is chosen when it is left unset; every other help ends with its default, if it has one.
    The special ones (`train --data`, `--seed`) are added by hand."""
    types = typing.get_type_hints(section)
    for option in dataclasses.fields(section):
        if "help" not in option.metadata:
            continue
        meta, name = option.metadata, option.metadata.get("flag", option.name.replace("_", "-"))
        kind = next((t for t in typing.get_args(types[option.name]) if t is not type(None)), types[option.name])
        if kind is bool:
            negative = option.default is not False
            group.add_argument(f"--no-{name}" if negative else f"--{name}", dest=option.name, default=option.default,
                               action="store_false" if negative else "store_true", help=meta["help"])
            continue
        help, more = meta["help"], None
        if unset and option.name in unset:
            more = f"chosen from the data's size when unset: {unset[option.name]}"
        elif option.default is not None:
            more = "default: %(default)s"
        if more:  # "(0: off)" becomes "(0: off; default: 0)"
            help = f"{help[:-1]}; {more})" if help.endswith(")") else f"{help} ({more})"
        group.add_argument(f"--{name}", dest=option.name, type=kind, default=option.default,
                           metavar=meta.get("metavar"), choices=meta.get("choices"), help=help)


def _from_flags(section: type, args, **more):
    """`section` from the flags `_add_config_flags` made of its fields, and `more`."""
    return section(**{option.name: getattr(args, option.name) for option in dataclasses.fields(section)
                      if "help" in option.metadata}, **more)


def _add_decoding_flags(parser: argparse.ArgumentParser) -> None:
    """A flag per GenerationConfig field: --max-new-tokens for max_new_tokens, and so on; and --tone."""
    group = parser.add_argument_group("decoding")
    group.add_argument("--tone", choices=TONES, help="answer in this tone (for models trained on a label column: "
                       "0 everyday, 1 sad, 2 love); default: none asked")
    _add_config_flags(group, GenerationConfig)


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

    train = commands.add_parser("train", help="train a chatbot on a Q&A CSV",
                                description="Train a chatbot on a Q&A CSV (columns Q,A[,label]) and write a model directory.")
    train.add_argument("--data", required=True, action="append", metavar="SOURCE",
                       help="CSV with question/answer columns (Q,A or question,answer; label optional), or a TFDS "
                            "dataset: tfds:korean_chatbot_data (the public ChatbotData); repeat to train on several")
    train.add_argument("--out", required=True, help="model directory to create")
    train.add_argument("--overwrite", action="store_true", help="replace --out if it exists (only once training succeeded)")
    train.add_argument("--resume", action="store_true", help="continue an interrupted run of the same --out")
    start = train.add_argument_group("what the new model starts from")
    start.add_argument("--base", default=DEFAULT_MODEL, metavar="DIR",
                       help="build on this trained model: keep its vocabulary, network and small talk, and read "
                            "meaning with multilingual-e5-small, so a small FAQ is understood in other words from the "
                            "start (default: %(default)s)")
    start.add_argument("--from-scratch", action="store_true",
                       help="learn a vocabulary and a network from this data alone (how models/default is trained); "
                            "the model flags below apply only then")
    _add_config_flags(start, RetrievalConfig)
    model = train.add_argument_group("model (with --from-scratch)")
    _add_config_flags(model, ModelConfig)
    _add_config_flags(model, TokenizerConfig)
    _add_config_flags(train.add_argument_group("what the encoder reads besides the question (with --from-scratch)"),
                      ContextConfig)
    training = train.add_argument_group("training")
    _add_config_flags(training, TrainConfig, WHEN_UNSET)
    _add_config_flags(training, DataConfig, WHEN_UNSET)
    training.add_argument("--seed", type=int, default=TrainConfig().seed, help="seeds the validation split, the "
                          "weights and the order of the pairs (default: %(default)s)")
    train.set_defaults(handler=run_train)

    chat = commands.add_parser("chat", help="talk to a model in the terminal",
                               description="Chat with a model: a REPL, one --question, or one reply per line of piped stdin.")
    chat.add_argument("--model", default=DEFAULT_MODEL, help=f"model directory (default: {DEFAULT_MODEL})")
    chat.add_argument("--question", "-q", help="answer this one question and exit")
    chat.add_argument("--no-context", dest="context", action="store_false",
                      help="answer each line of the conversation on its own (by default a model trained on "
                           "dialogues reads the two messages before each line; /new starts a new conversation)")
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


def training_config(args) -> ChatbotConfig:
    """The settings `train`'s flags ask for: each from its flag, and --seed for the split and the run alike."""
    try:
        return ChatbotConfig(model=_from_flags(ModelConfig, args), tokenizer=_from_flags(TokenizerConfig, args),
                             context=_from_flags(ContextConfig, args),
                             data=_from_flags(DataConfig, args, paths=tuple(map(str, args.data)), seed=args.seed),
                             train=_from_flags(TrainConfig, args, seed=args.seed),
                             retrieval=_from_flags(RetrievalConfig, args),
                             base="" if args.from_scratch else str(args.base))
    except ValueError as error:
        raise UserError(str(error)) from None


def run_train(args) -> None:
    from chatbot.training.distributed import multi_worker_strategy, read_tf_config, worker_out_dir

    role = strategy = None
    if args.strategy == "multi-worker":
        try:
            role = read_tf_config(os.environ)
        except ValueError as error:
            raise UserError(str(error)) from None
    config = training_config(args)
    if args.vocab_size < 16:
        raise UserError("--vocab-size must be at least 16")
    if not args.from_scratch:
        shaped = [f"--{option.name.replace('_', '-')}" for section in (ModelConfig, TokenizerConfig, ContextConfig,
                                                                       RetrievalConfig)
                  for option in dataclasses.fields(section)
                  if "help" in option.metadata and getattr(args, option.name) != option.default
                  and (section is not RetrievalConfig or option.name in RETRIEVAL_WEIGHTS)]
        if shaped:
            raise UserError(f"{', '.join(shaped)} shape a new network: add --from-scratch (by default a model builds "
                            f"on --base {args.base}, whose shape it keeps)")
        if not is_model_dir(Path(args.base)):
            raise UserError(f"--base {args.base}: no model directory there; pass --base DIR, or --from-scratch to "
                            f"train without one")
        try:
            check_model_dir(args.base)
        except ArtifactError as error:
            raise UserError(f"--base: {error}") from None
    final = Path(args.out)
    out = worker_out_dir(final, role)  # only the chief writes --out
    if out == final and out.exists() and not args.overwrite and not args.resume:  # a resume may find it saved
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    if out == final:
        check_replaceable(out, is_own_model_dir, "a model directory (only what `train` writes)")
    check_writable(out)
    from chatbot.data.datasets import is_tfds, load_sources

    def load():
        return load_sources(args.data, log=lambda line: print(line, flush=True))

    # Every mistake so far, and a CSV's, is said at once: TensorFlow takes seconds to load. TFDS runs
    # TensorFlow ops, so it loads after a multi-worker strategy, which must come before any op.
    from_tfds = any(map(is_tfds, args.data))
    pairs = None if from_tfds else load()
    small_talk = None
    if args.small_talk:
        from chatbot.data.pairs import load_pairs

        small_talk = load_pairs(args.small_talk)[0]
    _load_tensorflow(find_devices=role is None)
    if role is not None:
        strategy = multi_worker_strategy()
    if from_tfds:
        pairs = load()
    from chatbot.tokenizer.subword import VocabularyError
    from chatbot.training.train import load_base, train

    try:
        base = None if args.from_scratch else load_base(args.base)
    except ArtifactError as error:
        raise UserError(f"--base: {error}") from None
    from chatbot.training.run_dir import InterruptWatch

    with InterruptWatch() as watch:  # Ctrl-C stops the run even when its KeyboardInterrupt is swallowed
        try:
            train(pairs, config, out, base=base, resume=args.resume, overwrite=args.overwrite or out != final,
                  strategy=strategy, callbacks=[watch], small_talk=small_talk)
        except VocabularyError as error:
            raise UserError(f"--vocab-size {args.vocab_size}: {error}") from None
        watch.check()
    if out != final:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        print(f"worker {role.index} done: the chief saves the model at its --out")
        return
    print(f"saved: {out}\ntry it: {program_name()} chat --model {out}")


def run_chat(args) -> None:
    terminal.chat(args.model, args.question, _decoding(args), load_tensorflow=_load_tensorflow, context=args.context)


def run_eval(args) -> None:
    import json

    from chatbot.data.pairs import load_pairs

    decoding = _decoding(args)
    if args.replies and Path(args.replies).exists() and not args.overwrite:
        raise UserError(f"{args.replies} already exists; choose another --replies or pass --overwrite")
    if args.latency_sample < 0:
        raise UserError("--latency-sample must be 0 or more")
    check_model_dir(args.model)
    pairs, _ = load_pairs(args.data)
    _load_tensorflow()
    from chatbot.training.evaluate import evaluate
    from chatbot.decoding.chatbot import Chatbot

    result = evaluate(Chatbot.load(args.model), pairs, latency_sample=args.latency_sample, replies_out=args.replies,
                      **decoding)
    print(json.dumps({"model": str(args.model), "data": str(args.data), **result}, ensure_ascii=False, indent=2))


def run_export(args) -> None:
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise UserError(f"{out} already exists; choose another --out or pass --overwrite")
    check_replaceable(out, is_export, "a SavedModel written by `export`")
    check_writable(out)
    check_model_dir(args.model)
    _load_tensorflow()
    from chatbot.serving.saved_model import export_saved_model

    export_saved_model(args.model, out, overwrite=args.overwrite)
    print(f"saved: {out} (serving_default: strings 'questions' -> strings 'replies')")


def run_download(args) -> None:
    path = download_chatbot_data(args.out, overwrite=args.overwrite, url=args.url, sha256=args.sha256)
    print(f"saved: {path}\ntrain on it: {program_name()} train --data {path} --out models/chatbotdata")


def _load_tensorflow(find_devices: bool = True) -> None:
    """TensorFlow without its start-up notes or Keras's extras (`chatbot.startup`). `find_devices` False: a
    multi-worker run, whose strategy must come before TensorFlow looks for devices."""
    import_tensorflow_quietly(find_devices=find_devices, lean=True)
    # TensorFlow's million import-time objects live until exit, where the interpreter would walk
    # them all once more (a second of a one-question `chat -q`); frozen, it leaves them be.
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
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

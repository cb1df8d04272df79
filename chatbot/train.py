"""Training: tokenizer, datasets, model, compile, callbacks, distribution, artifacts.

Owns: one `train()` that turns clean pairs and a `ChatbotConfig` into a model directory.
State of an unfinished run (tokenizer, backups, best weights, logs) lives in `<out>.training/`
beside the output (see `chatbot.runstate`), so `resume=True` continues a killed or crashed run
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

from chatbot.artifacts import (EMBEDDINGS_FILE, HISTORY_FILE, INDEX_FILE, METRICS_FILE, SENTENCE_FILE, ArtifactError,
                               array_bytes, discard_dir, keras_bytes, kill_point, save_model_dir)
from chatbot.config import FOR_OWN_DATA, ChatbotConfig, TokenizerConfig
from chatbot.context import context_for, training_batches
from chatbot.data import DataError, QAPair, split_by_question
from chatbot.fitting import WorkerFit
from chatbot.losses import MaskedAccuracy, MaskedSparseCrossEntropy
from chatbot.model import Transformer
from chatbot.optim import transformer_optimizer
from chatbot.pipeline import fits
from chatbot.retrieval import Retriever, calibrated_threshold, index_hash, index_json, saved_embeddings
from chatbot.schedule import fitted_to_data, learning_verdict, read_history
from chatbot.runstate import (BACKUP_DIR, EpochBackup, PromoteFile, clear_leftovers, keep_history, note_crash,
                              prepare_state, start_state, state_dir_for)
from chatbot.tokenizer import Tokenizer


SENTENCE_EPOCHS = 6  # the sentence encoder's; measured in bench/retrieval.py


def has_gpu() -> bool:
    return bool(tf.config.list_physical_devices("GPU"))


def make_strategy(name: str) -> tf.distribute.Strategy:
    """auto: the default (one device); mirrored: every GPU, else every logical CPU; multi-worker: TF_CONFIG."""
    if name == "mirrored":
        devices = [d.name for d in tf.config.list_logical_devices("GPU")]
        return tf.distribute.MirroredStrategy(devices or [d.name for d in tf.config.list_logical_devices("CPU")])
    if name == "multi-worker":
        from chatbot.cluster import multi_worker_strategy

        return multi_worker_strategy()  # works only before this process ran any TensorFlow op
    return tf.distribute.get_strategy()


def _best_so_far(history_path: Path | None, monitor: str, best=min) -> float | None:
    if history_path is None:
        return None
    values = [float(row[monitor]) for row in read_history(history_path) if row.get(monitor)]
    return best(values) if values else None


def _selection_callbacks(config: ChatbotConfig, model, tokenizer, retriever, val_pairs, best_path: Path,
                         history_path: Path | None, xla: bool) -> list:
    """The callbacks that keep the chosen epoch's weights at `best_path` (and stop early, if asked).
    They run before the CSV logger, so `val_chrf` lands in history.csv. Without validation pairs,
    "chrf" and "loss" keep the epoch with the lowest training loss. The validation replies are decoded
    with XLA when training uses it: on a CPU a plain graph traces in half the time of a compilation and
    decodes an epoch's questions almost as fast."""
    select, patience = config.train.select, config.train.early_stopping
    if select == "chrf" and val_pairs:
        from chatbot.generate import Chatbot
        from chatbot.selection import ReplyQualityCheckpoint

        monitor, mode = "val_select", "max"
        chosen = [ReplyQualityCheckpoint(Chatbot(model, tokenizer, config, retriever=retriever, jit_compile=xla),
                                         val_pairs, best_path,
                                         best=_best_so_far(history_path, monitor, max))]
    else:
        monitor, mode = ("val_loss" if val_pairs else "loss"), "min"
        chosen = [] if select == "last" else [keras.callbacks.ModelCheckpoint(
            str(best_path), monitor=monitor, save_best_only=True, save_weights_only=True,
            initial_value_threshold=_best_so_far(history_path, monitor))]
    if patience:
        chosen.append(keras.callbacks.EarlyStopping(monitor, patience=patience, mode=mode))
    return chosen


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
    encoder: object  # chatbot.sentence.SentenceEncoder, or None


def load_base(path: str | Path) -> Base:
    from chatbot.artifacts import load_model_dir

    config, tokenizer, model, retriever = load_model_dir(path)
    return Base(str(path), config, tokenizer, model, retriever.encoder if retriever is not None else None)


def built_on(config: ChatbotConfig, base: Base) -> ChatbotConfig:
    """`config` for a model that builds on `base`: the base's network, vocabulary, encoder input and retrieval
    weights (what its weights were trained for), this run's data, schedule and fallback reply."""
    retrieval = dataclasses.replace(base.config.retrieval, fallback=config.retrieval.fallback, threshold=0.0,
                                    fallback_share=config.retrieval.fallback_share,
                                    **(FOR_OWN_DATA if base.encoder is not None else {}))
    context = dataclasses.replace(base.config.context, index_hash="")
    return dataclasses.replace(config, model=base.config.model, tokenizer=base.config.tokenizer, context=context,
                               retrieval=retrieval, base=base.path)


def train(pairs: list[QAPair], config: ChatbotConfig, out_dir: str | Path, *, base: Base | None = None,
          resume: bool = False, overwrite: bool = False, callbacks=(), verbose: int | str = "auto", log=print,
          strategy=None) -> Path:
    """Train on `pairs` and write a model directory at `out_dir`. Returns its path. `base`: a model to build on
    (`load_base`; `config.base` names its directory); None: from scratch. `strategy`: a tf.distribute strategy
    made earlier (multi-worker: `chatbot.cluster.multi_worker_strategy()` at the start of the process); None:
    one made from `config.train.strategy`."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)  # as `save_model_dir` would, before the run's state goes beside it
    if clear_leftovers(out_dir) and resume:
        log(f"nothing to resume: {out_dir} had been saved (its run was killed while cleaning up)")
        return out_dir
    if out_dir.exists() and not overwrite:
        raise ArtifactError(f"{out_dir} already exists; choose another --out or pass --overwrite")
    seed_generators(config.train.seed)
    config = fitted_to_data(config, len(pairs), built_on_base=base is not None)
    config = built_on(config, base) if base is not None else context_for(config, pairs)
    train_pairs, val_pairs = split_by_question(pairs, config.data.val_fraction, config.data.seed)
    state = state_dir_for(out_dir)
    tokenizer = prepare_state(state, config, resume, log)  # a resumed run goes on with its own vocabulary
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
    try:
        return _fit_and_save(tokenizer, train_pairs, val_pairs, config, out_dir, base=base, overwrite=overwrite,
                             callbacks=callbacks, verbose=verbose, log=log, strategy=strategy)
    except Exception as error:  # a kill leaves no note; a crash does, so the next run can tell them apart
        note_crash(state, error)
        log(f"training stopped by {type(error).__name__}; the run is kept in {state}: pass --resume to continue "
            f"it from its last completed epoch once the cause is fixed, or delete that folder to start over")
        raise


def _fit_and_save(tokenizer: Tokenizer, train_pairs: list[QAPair], val_pairs: list[QAPair], config: ChatbotConfig,
                  out_dir: Path, *, base: Base | None = None, overwrite: bool, callbacks, verbose, log,
                  strategy=None) -> Path:
    """The run itself, once its state directory is ready: fit from the last backup, save, clean up."""
    state = state_dir_for(out_dir)
    config = dataclasses.replace(
        config,
        model=dataclasses.replace(config.model, vocab_size=tokenizer.vocab_size),
        tokenizer=TokenizerConfig(config.tokenizer.vocab_size, tokenizer.vocab_hash))

    # Training and validation questions retrieve from the training pairs only; the saved index holds all.
    encoder = None
    if config.context.retrieved and config.retrieval.meaning:
        encoder = base.encoder if base is not None else _sentence_encoder(state, tokenizer, train_pairs, config, log)
    retriever = Retriever(train_pairs, config.retrieval, encoder, tokenizer) if config.context.retrieved else None
    strategy = strategy or make_strategy(config.train.strategy)
    replicas = strategy.num_replicas_in_sync
    train_data, too_long = training_batches(tokenizer, train_pairs * config.train.repeats, config, True, retriever,
                                            True, replicas)
    val_data = (training_batches(tokenizer, val_pairs, config, False, retriever, replicas=replicas)[0]
                if val_pairs else None)
    t = config.train
    log(f"split: {len(train_pairs)} train / {len(val_pairs)} validation pairs (by question, seed "
        f"{config.data.seed}); vocabulary {tokenizer.vocab_size} pieces; "
        f"{too_long // t.repeats} training pairs skipped: their answer is longer than {config.model.max_length} tokens")
    log(f"schedule: {t.epochs} epochs of batch {t.batch_size}, each pair {t.repeats}x an epoch, warmup "
        f"{t.warmup_steps} steps" + (f", peak learning rate {t.peak_learning_rate:.2g}" if t.peak_learning_rate else "")
        + (f"; stops after {t.early_stopping} epochs without a better {t.select} score" if t.early_stopping else ""))
    if config.context.retrieved or config.context.tone:
        k = config.context.retrieved
        plural = "s" if k > 1 else ""
        retrieved = (f" and the {k} nearest training question{plural} with {'their' if k > 1 else 'its'} answer{plural}"
                     if config.context.questions else f" and the answer{plural} of the {k} nearest training question{plural}")
        log(f"encoder input: the question{', its tone' if config.context.tone else ''}{retrieved if k else ''}"
            f" (up to {config.model.encoder_length} tokens)")

    gpu = has_gpu()
    mixed = gpu if config.train.mixed_precision is None else config.train.mixed_precision
    xla = gpu if config.train.xla is None else config.train.xla
    log(f"device: {'GPU' if gpu else 'CPU'}; mixed precision {'on' if mixed else 'off'}; XLA {'on' if xla else 'off'}; "
        f"{strategy.num_replicas_in_sync} replica(s)")
    with strategy.scope():
        model = FittedTransformer.from_config_dataclass(config.model, dtype="mixed_float16" if mixed else "float32")
        model.compile(optimizer=transformer_optimizer(config.model.d_model, config.train.warmup_steps,
                                                      config.train.peak_learning_rate),
                      loss=MaskedSparseCrossEntropy(config.train.label_smoothing),
                      metrics=[MaskedAccuracy()], jit_compile=xla)
        _build(model)
        # Built now, not in fit's first trace of the train step: a tf.function that creates variables
        # traces a second time, which cost 4-5 s of every run (batches split evenly across replicas keep
        # MirroredStrategy working with an optimizer built before fit).
        model.optimizer.build(model.trainable_variables)
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):  # see WorkerFit._maybe_symbolic_build
            model.build_compiled(next(iter(train_data)))

    best_path, staged_best = state / "best.weights.h5", state / "best.staged.weights.h5"
    history_path = state / HISTORY_FILE
    backup = EpochBackup(state / BACKUP_DIR)
    with strategy.scope():
        done = backup.restore(model)
        if base is not None and not done:
            model.set_weights(base.model.get_weights())
            log(f"building on {config.base}: its vocabulary, weights and sentence encoder")
    keep_history(history_path, done)
    all_callbacks = [
        *_selection_callbacks(config, model, tokenizer, retriever, val_pairs if val_data is not None else [], staged_best,
                              history_path if done else None, xla),
        PromoteFile(staged_best, best_path),
        keras.callbacks.CSVLogger(str(history_path), append=True),
        backup,  # after the history row and the best weights: only then is the epoch done
        keras.callbacks.TensorBoard(str(state / "logs")),
        keras.callbacks.TerminateOnNaN(),
        *callbacks,
    ]
    model.fit(train_data, validation_data=val_data, epochs=config.train.epochs, initial_epoch=done,
              callbacks=all_callbacks, verbose=verbose, shuffle=False)  # the dataset shuffles itself

    if best_path.is_file():
        model.load_weights(best_path)
    inference_model = Transformer.from_config_dataclass(config.model)  # float32, whatever training used
    _build(inference_model)
    inference_model.set_weights(model.get_weights())
    metrics = _evaluate(inference_model, val_data)
    log("validation: " + (", ".join(f"{k} {v:.4f}" for k, v in metrics.items()) if metrics else "no held-out pairs"))
    from chatbot.evaluate import reply_variety
    from chatbot.generate import Chatbot
    from chatbot.selection import fit_rerank

    # "eager": the variety check decodes one batch, op by op, as tracing its loop would cost more than running it
    # once; the rerank fit traces its own function over every batch, whatever the bot's mode.
    bot = Chatbot(inference_model, tokenizer, config, retriever=retriever, jit_compile="eager")
    if retriever is not None and val_pairs:
        config = dataclasses.replace(config, rerank=fit_rerank(bot, val_pairs, log))
    history = read_history(history_path)
    # Decoding the variety check costs seconds on a small run: only when the history alone shows learning.
    verdict = learning_verdict(history) or learning_verdict(history, *reply_variety(bot, train_pairs))
    if verdict:
        log(f"warning: {verdict}")
    metrics["learned"], metrics["warning"] = not verdict, verdict
    extra = {METRICS_FILE: json.dumps(metrics, indent=2).encode()}
    if config.context.retrieved:
        threshold = calibrated_threshold(retriever, train_pairs, val_pairs, config.retrieval.fallback_share)
        config = dataclasses.replace(config, retrieval=dataclasses.replace(config.retrieval, threshold=threshold))
        log(f"fallback: a message whose nearest training question scores below {threshold:.3f} gets "
            f"\"{config.retrieval.fallback}\"")
        extra[INDEX_FILE] = index_json(train_pairs + val_pairs)
        config = dataclasses.replace(config, context=dataclasses.replace(config.context,
                                                                         index_hash=index_hash(extra[INDEX_FILE])))
        if encoder is not None:
            extra[SENTENCE_FILE] = keras_bytes(encoder)
            extra[EMBEDDINGS_FILE] = array_bytes(saved_embeddings(train_pairs + val_pairs, encoder, tokenizer))
    if history_path.is_file():
        extra[HISTORY_FILE] = history_path.read_bytes()
    save_model_dir(out_dir, config, tokenizer, inference_model, extra, overwrite=overwrite,
                   extra_dirs={"logs": state / "logs"})
    kill_point("saved")
    discard_dir(state)
    return out_dir


def _sentence_encoder(state: Path, tokenizer: Tokenizer, pairs: list[QAPair], config: ChatbotConfig, log):
    """The sentence encoder retrieval reads meaning with, trained on `pairs` (`sentence.answer_groups`), or the
    one an interrupted run trained already (kept in its state directory)."""
    from chatbot.sentence import answer_groups, fit_sentence_encoder

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


def _build(model: Transformer) -> None:
    """Create every weight by running one tiny batch (needed before restoring a backup)."""
    ids = tf.constant([[1, 2]], tf.int32)
    model((ids, ids), training=False)


def _evaluate(model: Transformer, val_data) -> dict:
    if val_data is None:
        return {}
    model.compile(loss=MaskedSparseCrossEntropy(), metrics=[MaskedAccuracy()])
    loss, accuracy = model.evaluate(val_data, verbose=0)
    return {"val_loss": float(loss), "val_perplexity": float(math.exp(min(loss, 50.0))),
            "val_masked_accuracy": float(accuracy)}

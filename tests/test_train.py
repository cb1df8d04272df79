import csv
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from chatbot.artifacts import ArtifactError, load_model_dir
from chatbot.config import ChatbotConfig
from chatbot.data.pairs import load_pairs
from chatbot.training.train import state_dir_for, train
from conftest import ROOT, TINY_PAIRS, saved_model_class, tiny_config, write_csv


def test_tiny_model_answers_its_training_questions(tiny_bot):
    questions = [q for q, _, _ in TINY_PAIRS]
    answers = [a for _, a, _ in TINY_PAIRS]
    replies = tiny_bot.reply_batch(questions)
    right = sum(reply == answer for reply, answer in zip(replies, answers))
    assert right >= 24, list(zip(questions, replies))  # 80% of pairs learned by heart
    assert tiny_bot.reply("배고파") == "맛있는 거 드세요."


def test_model_directory_is_complete(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {"config.json", "tokenizer.model", "model.keras", "history.csv", "metrics.json"} <= names
    assert not state_dir_for(tiny_model_dir).exists()  # the run's scratch space is gone
    config = ChatbotConfig.read(tiny_model_dir / "config.json")
    assert config.model.num_layers == 1 and len(config.tokenizer.vocab_hash) == 64
    history = (tiny_model_dir / "history.csv").read_text().splitlines()
    assert history[0].startswith("epoch") and len(history) == 1 + config.train.epochs


def test_a_model_directory_saves_a_plain_transformer(tiny_model_dir):
    """The multi-worker work-arounds of `fit` (`fitting.WorkerFit`, in `train.FittedTransformer`) stay in
    training: model.keras holds a plain `chatbot.model.transformer.Transformer` and loads as one."""
    from chatbot.training.worker_fit import WorkerFit
    from chatbot.model.transformer import Transformer

    assert saved_model_class(tiny_model_dir) == "chatbot.model.transformer.Transformer"
    model = load_model_dir(tiny_model_dir)[2]
    assert type(model) is Transformer and not isinstance(model, WorkerFit)


def test_training_leaves_its_tensorboard_logs_in_the_model_directory(tiny_model_dir):
    """README: TensorBoard logs are in `<out>/logs`: the loss of every epoch of the run."""
    import tensorflow as tf
    from tensorflow.core.util import event_pb2

    events = sorted((tiny_model_dir / "logs" / "train").glob("events.out.tfevents.*"))
    assert events, "no TensorBoard events in <out>/logs/train"
    tags = [value.tag for record in tf.data.TFRecordDataset([str(path) for path in events])
            for value in event_pb2.Event.FromString(record.numpy()).summary.value]
    epochs = ChatbotConfig.read(tiny_model_dir / "config.json").train.epochs
    assert tags.count("epoch_loss") == epochs, sorted(set(tags))


class Stopped(Exception):
    """Raised by `StopAtTheStart`: what a test needed was there before the first step."""


def training_model_settings(out, tiny_csv, **train_settings):
    """(dtype policy, jit_compile) of the model `train` fits, read when fitting starts and stopped there."""
    import keras

    seen = []

    class StopAtTheStart(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            seen.append((self.model.dtype_policy.name, self.model.jit_compile))
            raise Stopped

    pairs, _ = load_pairs(tiny_csv)
    config = tiny_config(epochs=1, repeats=1, select="last", **train_settings)
    config = dataclasses.replace(config, context=dataclasses.replace(config.context, retrieved=0))  # no encoder to fit
    with pytest.raises(Stopped):
        train(pairs, config, out, verbose=0, log=lambda *_: None, callbacks=[StopAtTheStart()])
    return seen[0]


def test_a_gpu_turns_on_mixed_precision_and_xla_unless_told_otherwise(tmp_path, tiny_csv, monkeypatch):
    import tensorflow as tf

    assert training_model_settings(tmp_path / "cpu", tiny_csv) == ("float32", False)
    listed = tf.config.list_physical_devices
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda device_type=None: [gpu] if device_type == "GPU" else listed(device_type))
    assert training_model_settings(tmp_path / "gpu", tiny_csv) == ("mixed_float16", True)
    assert training_model_settings(tmp_path / "told", tiny_csv, mixed_precision=False, xla=False) == ("float32", False)


def test_existing_output_is_never_overwritten_without_asking(tiny_model_dir):
    before = (tiny_model_dir / "model.keras").read_bytes()
    with pytest.raises(ArtifactError, match="already exists"):
        train([], tiny_config(epochs=1), tiny_model_dir)
    assert (tiny_model_dir / "model.keras").read_bytes() == before


def _train_command(csv, out, *extra):
    return [sys.executable, "-m", "chatbot", "train", "--from-scratch", "--data", str(csv), "--out", str(out), "--epochs", "6",
            "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--dff", "64", "--max-length", "16",
            "--vocab-size", "200", "--val-fraction", "0.2", "--batch-size", "8", "--warmup-steps", "50", *extra]


@pytest.mark.slow  # a training subprocess
def test_mirrored_strategy_trains_on_two_logical_cpus(tmp_path):
    data = write_csv(tmp_path / "pairs.csv", TINY_PAIRS)
    # One epoch of each pair once shows the replicas train together; more steps would only cost time.
    # Choosing the epoch by replies, or fitting rerank weights on retrieved answers, would only add decoding.
    arguments = _train_command(data, tmp_path / "mirrored", "--strategy", "mirrored", "--epochs", "1", "--repeats", "1",
                               "--select", "loss", "--retrieved", "0")[3:]
    script = f"""
from chatbot.startup import import_tensorflow_quietly
import_tensorflow_quietly(find_devices=False, lean=True)  # as the command line does, before the CPU is split
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from chatbot.cli.main import main
raise SystemExit(main({arguments!r}))
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "2 replica(s)" in result.stdout
    assert (tmp_path / "mirrored" / "model.keras").exists()
    # The epoch's validation loss (each replica's half of the batch, averaged) is the loss of the saved model
    # evaluated without replicas, not twice it as when the loss was left unscaled per replica.
    history = (tmp_path / "mirrored" / "history.csv").read_text().splitlines()
    epoch_loss = float(next(csv.DictReader(history))["val_loss"])
    final_loss = json.loads((tmp_path / "mirrored" / "metrics.json").read_text())["val_loss"]
    assert epoch_loss == pytest.approx(final_loss, rel=0.15)


@pytest.mark.slow  # trains a model
def test_mixed_precision_training_writes_a_float32_model(tmp_path, tiny_csv):
    pairs, _ = load_pairs(tiny_csv)
    out = train(pairs, tiny_config(epochs=1, repeats=1, mixed_precision=True), tmp_path / "mixed", verbose=0,
                log=lambda *_: None)
    _, _, model, _ = load_model_dir(out)
    assert model.dtype_policy.name == "float32"


@pytest.mark.slow  # trains two models
def test_same_seed_same_model_and_loaded_tokenizers_survive_training(tmp_path, tiny_csv, tiny_bot):
    pairs, _ = load_pairs(tiny_csv)
    before = tiny_bot.reply("배고파")
    runs = [train(pairs, tiny_config(epochs=1, repeats=1), tmp_path / name, verbose=0, log=lambda *_: None)
            for name in ("a", "b")]
    first, second = (load_model_dir(run)[2].get_weights() for run in runs)
    assert all(np.array_equal(x, y) for x, y in zip(first, second))
    assert tiny_bot.reply("배고파") == before  # training did not drop this model's tokenizer


@pytest.mark.slow  # a short training run
def test_a_run_that_did_not_learn_says_so_keeps_every_character_and_its_loops_are_cut(tmp_path, monkeypatch):
    """A run cut to a few steps at a tiny learning rate: `train` says in one line that it did not learn and
    metrics.json records it, from its losses alone (decoding replies to check their variety would only cost
    time). Its vocabulary holds every character of every pair, validation pairs included (a rare one lives
    only there), and what a user reads of its looping replies is each tidied (`tidy`)."""
    import chatbot.training.evaluate
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.decoding.postprocess import tidy, trim

    def decoded(*_):
        raise AssertionError("the losses already said the run did not learn: nothing to decode")

    monkeypatch.setattr(chatbot.training.evaluate, "reply_variety", decoded)

    rare = [("쀍 뷁 있어요?", "쀍과 뷁은 드문 글자예요.", 0)]
    pairs = [*load_pairs(write_csv(tmp_path / "d.csv", TINY_PAIRS + rare))[0]]
    config = tiny_config(epochs=2)
    config = dataclasses.replace(config, data=dataclasses.replace(config.data, val_fraction=0.5),
                                 train=dataclasses.replace(config.train, warmup_steps=100000, repeats=1, select="loss"))
    lines = []
    out = train(pairs, config, tmp_path / "m", verbose=0, log=lines.append)
    warnings = [line for line in lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "did not learn" in warnings[0]
    looked_up = [line for line in lines if line.startswith("leave-one-out retrieval of the training questions")]
    done, of = looked_up[-1].rsplit(": ", 1)[1].split(" of ")
    assert done == of  # its last line: every question looked up
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["learned"] is False and "did not learn" in metrics["warning"]

    bot = Chatbot.load(out, compilation="eager")  # one batch: running it op by op costs less than tracing
    texts = [p.answer for p in pairs] + [p.question for p in pairs]
    assert bot.tokenizer.decode(bot.tokenizer.encode(texts)) == texts
    request = bot.request([p.question for p in pairs], candidates=0)
    written = bot.generator.loop(bot.prepare(request.texts, request.tones, request.plan.candidates),
                                 bot.options(request.settings), request.plan)  # the loop's own ids, before any cut
    # an unlearned model loops, stutters and says phrases twice; what a user reads is each reply `tidy`'s
    tidied = tidy(written, bot.word_starts).numpy()
    assert (tidied != written.numpy()).any()
    expected = bot.tokenizer.decode(trim(tidied))
    assert bot.reply_batch([p.question for p in pairs], candidates=0) == expected

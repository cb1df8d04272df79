"""The state of an unfinished run: after a crash or a kill, the next `train` or
`train --resume` goes on or says exactly what to do, history.csv keeps every epoch once, and no
model or temporary is left half-made. The SIGKILL tests kill a real `python -m chatbot train`."""

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import keras
import pytest

from chatbot.artifacts import TOKENIZER_FILE, ArtifactError, load_model_dir
from chatbot.files import KILL_AT
from chatbot.data.pairs import load_pairs
from chatbot.training.run_dir import BACKUP_DIR, CRASH_NOTE, STATE_CONFIG, EpochBackup, keep_history, state_dir_for
from chatbot.training.train import train
from conftest import ROOT, tiny_config

QUIET = dict(verbose=0, log=lambda *_: None)


class CrashAfter(keras.callbacks.Callback):
    """Raise at the end of the `epochs`-th epoch, as a full disk or a bug in a callback would."""

    def __init__(self, epochs):
        super().__init__()
        self.epochs = epochs

    def on_epoch_end(self, epoch, logs=None):
        if epoch + 1 == self.epochs:
            raise RuntimeError("disk on fire")


@pytest.fixture(scope="module")
def pairs(tiny_csv):
    """The runs here train each of these pairs once an epoch (`repeats=1`): they show what a run leaves, not learning."""
    return load_pairs(tiny_csv)[0] * 2


def history_epochs(model_dir):
    return [line.split(",")[0] for line in (model_dir / "history.csv").read_text().splitlines()[1:]]


@pytest.fixture(scope="module")
def crashed(pairs, tmp_path_factory):
    """The state folder of a run that crashed after two of its four epochs, made once for the module."""
    out = tmp_path_factory.mktemp("crashed") / "model"
    with pytest.raises(RuntimeError, match="disk on fire"):
        train(pairs, tiny_config(epochs=4, repeats=1), out, callbacks=[CrashAfter(2)], **QUIET)
    return state_dir_for(out)


def crash_after_two_epochs(crashed, out):
    """What the crashed run left, as if it had been writing `out`: a copy of its state folder."""
    return shutil.copytree(crashed, state_dir_for(out))


@pytest.mark.slow  # trains models in this process
def test_a_crash_is_reported_as_a_crash_and_resume_or_delete_is_the_advice(pairs, crashed, tmp_path):
    out = tmp_path / "model"
    state = crash_after_two_epochs(crashed, out)
    assert (state / CRASH_NOTE).read_text().strip() == "RuntimeError: disk on fire"
    with pytest.raises(ArtifactError) as refused:
        train(pairs, tiny_config(epochs=4, repeats=1), out, **QUIET)
    message = str(refused.value)
    assert "stopped with an error after 2 epoch(s)" in message and "RuntimeError: disk on fire" in message
    assert "interrupted" not in message and "--resume" in message and "delete that folder" in message


@pytest.mark.slow  # trains models in this process
@pytest.mark.parametrize("backups_lost", [0, 1], ids=["killed-after-the-backup", "killed-before-the-backup"])
def test_resume_after_two_epochs_to_four_keeps_every_history_row_once(pairs, crashed, tmp_path, backups_lost):
    """Killed before its backup, an epoch has its history row but is redone: the row is not doubled."""
    out = tmp_path / "model"
    state = crash_after_two_epochs(crashed, out)
    for name in sorted(os.listdir(state / BACKUP_DIR), reverse=True)[:backups_lost]:
        (state / BACKUP_DIR / name).unlink()  # what a kill between the history row and the backup leaves
    train(pairs, tiny_config(epochs=4, repeats=1), out, resume=True, **QUIET)
    assert history_epochs(out) == ["0", "1", "2", "3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.slow  # trains models in this process
def test_a_state_folder_with_only_backups_is_one_clear_error_on_resume_and_replaced_with_overwrite(pairs, tmp_path, capsys):
    from chatbot.cli import main as cli
    from conftest import TINY_PAIRS, write_csv

    out = tmp_path / "model"
    state = state_dir_for(out)
    (state / BACKUP_DIR).mkdir(parents=True)
    (state / BACKUP_DIR / "latest.weights.h5").write_bytes(b"left by a kill while the folder was removed")
    with pytest.raises(ArtifactError, match="delete that folder and train again without --resume"):
        train(pairs, tiny_config(epochs=1, repeats=1), out, resume=True, **QUIET)

    csv = write_csv(tmp_path / "pairs.csv", TINY_PAIRS)
    status = cli.main(["train", "--from-scratch", "--data", str(csv), "--out", str(out), "--resume"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: cannot resume") and err.count("\n") == 1, err

    with pytest.raises(ArtifactError, match="holds no training run.*--overwrite"):  # it may hold the user's files
        train(pairs, tiny_config(epochs=1, repeats=1), out, **QUIET)
    assert (state / BACKUP_DIR / "latest.weights.h5").is_file()
    lines = []
    train(pairs, tiny_config(epochs=1, repeats=1), out, overwrite=True, verbose=0, log=lines.append)
    assert any("holds no training run" in line for line in lines) and load_model_dir(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "pairs.csv"]


def test_a_training_folder_that_holds_the_users_files_is_never_deleted_without_overwrite(tmp_path, capsys):
    from chatbot.cli import main as cli
    from conftest import TINY_PAIRS, write_csv

    """`train --out m2` beside a `m2.training/` that is not a run's (the user's own folder of that name) refuses
    with one line and leaves every file in it; --overwrite is the user's say-so."""
    out = tmp_path / "m2"
    mine = state_dir_for(out) / "notes.txt"
    mine.parent.mkdir()
    mine.write_text("내 메모", encoding="utf-8")
    csv = write_csv(tmp_path / "pairs.csv", TINY_PAIRS)
    status = cli.main(["train", "--from-scratch", "--data", str(csv), "--out", str(out), "--epochs", "1"])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and "--overwrite" in err and err.count("\n") == 1, err
    assert mine.read_text(encoding="utf-8") == "내 메모" and not out.exists()


def test_the_state_of_a_run_killed_after_saving_is_recognised_and_removed(tiny_model_dir, tmp_path):
    out = shutil.copytree(tiny_model_dir, tmp_path / "model")
    state = state_dir_for(out)
    state.mkdir()
    for name in (TOKENIZER_FILE, "history.csv"):
        shutil.copy(out / name, state / name)
    (state / STATE_CONFIG).write_text("{}")
    lines = []
    assert train([], tiny_config(), out, resume=True, verbose=0, log=lines.append) == out
    assert "had been saved" in lines[0] and not state.exists()
    with pytest.raises(ArtifactError, match="already exists"):  # no "interrupted run" any more
        train([], tiny_config(), out, **QUIET)


def test_keep_history_drops_rows_past_the_backup_and_a_row_cut_short(tmp_path):
    path = tmp_path / "history.csv"
    path.write_bytes(b"epoch,loss\r\n0,3.1\r\n1,2.5\r\n2,2.0\r\n3,1.")
    keep_history(path, 2)
    assert path.read_bytes() == b"epoch,loss\r\n0,3.1\r\n1,2.5\r\n"
    keep_history(path, 0)
    assert path.read_bytes() == b"epoch,loss\r\n"


# -- SIGKILL a real `python -m chatbot train` ----------------------------------------------------

EPOCHS = 3


def train_command(out, *extra):
    return [sys.executable, "-m", "chatbot", "train", "--from-scratch", "--data", str(ROOT / "data" / "examples" / "library_faq.csv"),
            "--out", str(out), "--epochs", str(EPOCHS), "--num-layers", "1", "--d-model", "16", "--num-heads", "2",
            "--dff", "32", "--max-length", "16", "--vocab-size", "600", "--val-fraction", "0.05",
            "--batch-size", "16", "--warmup-steps", "50", "--select", "loss",
            "--retrieved", "0", *extra]  # no retrieval: no rerank weights to fit, which resuming does not touch


def history_rows(state):
    history = state / "history.csv"
    return len(history.read_text().splitlines()) - 1 if history.exists() else 0


def kill_at(point, process, state, rng):
    """SIGKILL `process` at `point`: a random delay, mid-epoch, or (CHATBOT_KILL_AT) it kills itself."""
    if point == "random":
        deadline = time.time() + rng.uniform(2, 8)
        while time.time() < deadline and process.poll() is None:
            time.sleep(0.05)
    elif point == "mid-epoch":
        deadline = time.time() + 300
        while history_rows(state) < 1 and time.time() < deadline and process.poll() is None:
            time.sleep(0.05)
        time.sleep(rng.uniform(0, 0.5))
    if process.poll() is None and point in ("random", "mid-epoch"):
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=300)


# Mid-swap, the riskiest moment of a save (an existing model is being replaced), in every run; all six
# (about 20 s each on 2 cores) with CHATBOT_ALL_KILL_POINTS=1, so that `pytest` stays within its five
# minutes. A kill mid-epoch is what the in-process resume tests above recover from.
KILL_POINTS = ["save-swapping"]
if os.environ.get("CHATBOT_ALL_KILL_POINTS"):
    KILL_POINTS = ["random", "mid-epoch", "save-written", "save-swapping", "epoch-end:2", "saved"]


@pytest.mark.slow  # two training subprocesses per kill point
@pytest.mark.parametrize("point", KILL_POINTS)
def test_after_a_sigkill_the_model_is_absent_or_whole_and_resume_finishes_clean(tmp_path, tiny_model_dir, point):
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    out = tmp_path / "model"
    overwrite = ["--overwrite"] if point == "save-swapping" else []
    if overwrite:  # an existing model is being replaced when the kill comes
        shutil.copytree(tiny_model_dir, out)
    env = {**os.environ, "PYTHONPATH": str(ROOT), KILL_AT: point}
    process = subprocess.Popen(train_command(out, *overwrite), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    state = state_dir_for(out)
    kill_at(point, process, state, rng)
    assert process.returncode == -signal.SIGKILL, f"{point} (seed {seed}): the run ended before the kill"

    if out.exists():  # never half-written
        assert load_model_dir(out), point
    resume = ["--resume"] if state.exists() else []  # a kill before the run's folder existed: start again
    backups = EpochBackup(state / BACKUP_DIR).backups()
    done = backups[0][0] if backups else 0
    env.pop(KILL_AT)
    resumed = subprocess.run(train_command(out, *resume, *overwrite), cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=600)
    assert resumed.returncode == 0, f"{point} (seed {seed}): {resumed.stderr[-2000:]}"
    if resume and done < EPOCHS:  # it goes on after the last backed-up epoch: none redone, none skipped
        assert f"Epoch {done + 1}/{EPOCHS}" in resumed.stdout, f"{point} (seed {seed}): {resumed.stdout[-2000:]}"
        assert done == 0 or "Epoch 1/" not in resumed.stdout, f"{point} (seed {seed}): {resumed.stdout[-2000:]}"
    load_model_dir(out)
    assert history_epochs(out) == [str(epoch) for epoch in range(EPOCHS)], point
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"], point

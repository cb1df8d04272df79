"""The state directory of an unfinished training run, `<out>.training/` beside the output.

Owns: starting it (saving the run's tokenizer and `run.json` settings under a temporary name, then
renaming), checking it before a resume and handing back the tokenizer it saved, the note a crash
leaves in it, per-epoch backups of the model and optimizer, keeping `history.csv` in step with the
backups, and telling a run that died half way from the leftovers of one that had finished. Every
file in it is written whole or not at all, so whatever moment a SIGKILL picks, the next `train` or
`train --resume` either goes on or says what to do. Must not learn the tokenizer, build models or
datasets (that is `train.py`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import threading
from pathlib import Path

import keras

from chatbot.artifacts import HISTORY_FILE, TOKENIZER_FILE, ArtifactError, check_model_dir, recover_model_dir
from chatbot.files import atomic_write_bytes, discard_dir, kill_point, remove_dead_temps, temp_path_beside
from chatbot.config import ChatbotConfig
from chatbot.tokenizer.subword import Tokenizer

STATE_CONFIG = "run.json"  # the settings an interrupted run was started with
CRASH_NOTE = "stopped.txt"  # the error that stopped the run, if it was an error and not a kill
BACKUP_DIR = "backup"


def state_dir_for(out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    return out_dir.with_name(out_dir.name + ".training")


def clear_leftovers(out_dir: Path) -> bool:
    """Tidy up after kills before a run: finish or undo an interrupted overwrite of `out_dir`,
    remove dead temporaries, and remove the state of a run that had already saved `out_dir` (killed
    while removing it). Returns True in that last case."""
    state = state_dir_for(out_dir)
    recover_model_dir(out_dir)
    remove_dead_temps(state)
    if state.is_dir() and _saved_as(state, out_dir):
        discard_dir(state)
        return True
    return False


def _saved_as(state: Path, out_dir: Path) -> bool:
    """Whether `out_dir` is the finished model of this run: same vocabulary, same history to the byte."""
    try:
        check_model_dir(out_dir)
        return all((state / name).read_bytes() == (out_dir / name).read_bytes()
                   for name in (TOKENIZER_FILE, HISTORY_FILE))
    except (OSError, ArtifactError):
        return False


def _settings(config: ChatbotConfig) -> dict:
    """What `run.json` records of `config`, as it will read back: a resume must ask for the same."""
    settings = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(config).items()
                                      if k in ("model", "context", "data", "train")}))
    settings["train"].pop("epochs")  # a resumed run may ask for more epochs
    return settings


def prepare_state(state: Path, config: ChatbotConfig, resume: bool, log=print, overwrite: bool = False) -> Tokenizer | None:
    """Check that a resumed run directory was started with the same settings and return its saved
    tokenizer; for a new run, make way for it and return None: learn a tokenizer, then `start_state`. An
    unfinished run is refused. A folder of that name without a run's settings and vocabulary is not a run's
    (`start_state` and `discard_dir` never leave one so): it is refused too, and removed only with
    `overwrite`, since it may hold the user's own files."""
    settings = _settings(config)
    missing = [name for name in (STATE_CONFIG, TOKENIZER_FILE) if not (state / name).is_file()]
    if resume:
        if not state.is_dir():
            raise ArtifactError(f"nothing to resume: {state} does not exist (train without --resume to start)")
        if missing:
            raise ArtifactError(f"cannot resume: {state} holds no complete run (no {' or '.join(missing)}; a kill "
                                f"while it was being set up or removed leaves this): delete that folder and train "
                                f"again without --resume")
        saved = json.loads((state / STATE_CONFIG).read_text(encoding="utf-8"))
        if saved != settings:
            changed = sorted(f"{section}.{key}" for section in settings for key in settings[section]
                             if saved.get(section, {}).get(key) != settings[section][key])
            raise ArtifactError(f"--resume with different settings than the interrupted run: {', '.join(changed)}")
        (state / CRASH_NOTE).unlink(missing_ok=True)
        return Tokenizer.load(state / TOKENIZER_FILE)
    if state.exists() and missing and not overwrite:
        raise ArtifactError(f"{state} is in the way and holds no training run (no {' or '.join(missing)}): move "
                            f"what you keep there, or pass --overwrite to delete it")
    if state.exists() and missing:
        log(f"removing {state}: --overwrite, and it holds no training run (no {' or '.join(missing)})")
        discard_dir(state)
    elif state.exists():
        raise ArtifactError(describe_unfinished(state))
    return None


def start_state(state: Path, config: ChatbotConfig, tokenizer: Tokenizer) -> None:
    """Create the directory of a new run with its tokenizer and settings, whole or not at all."""
    temp = temp_path_beside(state)
    temp.mkdir()
    tokenizer.save(temp / TOKENIZER_FILE)
    (temp / STATE_CONFIG).write_text(json.dumps(_settings(config), indent=2), encoding="utf-8")
    temp.rename(state)


def describe_unfinished(state: Path) -> str:
    """What is in `state` and what to do about it, for a new run that finds it."""
    done = EpochBackup(state / BACKUP_DIR).last_epoch()
    note = state / CRASH_NOTE
    if note.is_file():
        reason = note.read_text(encoding="utf-8", errors="replace").strip()
        return (f"a run that stopped with an error after {done} epoch(s) is in {state} ({reason}): pass --resume "
                f"to continue it once the cause is fixed, or delete that folder to start over")
    return (f"an interrupted run (killed after {done} epoch(s)) is in {state}: pass --resume to continue it, "
            f"or delete that folder to start over")


def note_crash(state: Path, error: BaseException) -> None:
    """Leave the error in the run's state, so the next run tells a crash from a kill. Never raises:
    the error being reported matters more."""
    detail = " ".join(str(error).split())[:300]
    try:
        if (state / STATE_CONFIG).is_file():
            atomic_write_bytes(state / CRASH_NOTE, f"{type(error).__name__}: {detail}\n".encode())
    except OSError:
        pass


def keep_history(path: Path, epochs: int) -> None:
    """Keep the header and the rows of the first `epochs` epochs of a CSVLogger history: a row
    written before a kill that came ahead of its epoch's backup would be written again when the
    epoch is redone. A last line without its newline was cut by a kill and goes too."""
    if not path.is_file():
        return
    lines = path.read_bytes().splitlines(keepends=True)
    kept = lines[:1] + [line for line in lines[1:] if line.endswith(b"\n")
                        and line.split(b",")[0].strip().isdigit() and int(line.split(b",")[0]) < epochs]
    if kept != lines:
        atomic_write_bytes(path, b"".join(kept))


class EpochBackup(keras.callbacks.Callback):
    """Back up the model and its optimizer after every epoch as `epoch-<N>.weights.h5` in `folder`
    (N epochs done), written under a temporary name and renamed, so a kill never leaves a
    half-written backup; the one before is kept in case the newest does not load.

    Put it after every callback that writes an epoch's results (best weights, history.csv): an
    epoch counts as done only once its backup exists, so a kill before it redoes the epoch and one
    after it loses nothing. Keras's BackupAndRestore writes weights and epoch number as two files
    in place, which a kill can leave half-written or out of step."""

    NAME = re.compile(r"epoch-(\d+)\.weights\.h5")
    LEGACY = ("latest.weights.h5", "training_metadata.json")  # BackupAndRestore's, in runs of older versions

    def __init__(self, folder: str | Path):
        super().__init__()
        self.folder = Path(folder)

    def backups(self) -> list[tuple[int, Path]]:
        """(epochs done, weights file) of every backup, newest first."""
        if not self.folder.is_dir():
            return []
        found = [(int(match[1]), path) for path in self.folder.iterdir() if (match := self.NAME.fullmatch(path.name))]
        weights, metadata = (self.folder / name for name in self.LEGACY)
        if not found and weights.is_file():
            try:
                found = [(int(json.loads(metadata.read_text(encoding="utf-8"))["epoch"]), weights)]
            except (OSError, ValueError, KeyError, TypeError):
                pass
        return sorted(found, reverse=True)

    def last_epoch(self) -> int:
        return next((done for done, _ in self.backups()), 0)

    def restore(self, model: keras.Model) -> int:
        """Load the newest backup that loads into the built, compiled `model`; returns how many
        epochs it had done (0 without a backup)."""
        backups = self.backups()
        if not backups:
            return 0
        if model.optimizer is not None and not model.optimizer.built:
            model.optimizer.build(model.trainable_variables)  # its variables are in the backup too
        tried = []
        for done, path in backups:
            try:
                model.load_weights(path)
                return done
            except Exception as error:  # damaged on disk: fall back to the one before
                tried.append(f"{path.name}: {type(error).__name__}")
        if tried:
            raise ArtifactError(f"cannot restore any backup in {self.folder} ({'; '.join(tried)}): delete "
                                f"{self.folder.parent} and train again without --resume")
        return 0

    def on_epoch_end(self, epoch, logs=None):
        done = epoch + 1
        kill_point(f"epoch-end:{done}")
        self.folder.mkdir(parents=True, exist_ok=True)
        partial = self.folder / ".partial.weights.h5"
        self.model.save_weights(partial, overwrite=True)
        os.replace(partial, self.folder / f"epoch-{done}.weights.h5")
        kill_point(f"backed-up:{done}")
        for _, old in self.backups()[2:]:
            old.unlink(missing_ok=True)


class PromoteFile(keras.callbacks.Callback):
    """At the end of every epoch, rename `staged` (if a checkpoint callback before this one wrote it)
    over `target`: a kill while the checkpoint is being written leaves the previous `target` whole."""

    def __init__(self, staged: Path, target: Path):
        super().__init__()
        self.staged, self.target = Path(staged), Path(target)

    def on_epoch_end(self, epoch, logs=None):
        if self.staged.is_file():
            os.replace(self.staged, self.target)


class InterruptWatch(keras.callbacks.Callback):
    """Ctrl-C that always stops training. Python raises KeyboardInterrupt wherever the main thread is, and where
    that is a garbage-collection hook (JAX installs one), the exception is printed and swallowed: training went
    on and the run saved a model with exit 0. While this is entered, SIGINT also marks the run interrupted, and
    every training and validation step and epoch end it watches (as a callback of the fit), and `check`, raise
    KeyboardInterrupt again once it is marked."""

    def __init__(self):
        super().__init__()
        self.interrupted = False
        self._previous = None

    def __enter__(self) -> "InterruptWatch":
        if threading.current_thread() is threading.main_thread():  # signal handlers belong to the main thread
            self._previous = signal.signal(signal.SIGINT, self._on_interrupt)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def _on_interrupt(self, signum, frame):
        self.interrupted = True
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raise KeyboardInterrupt if Ctrl-C was pressed, even if its first KeyboardInterrupt was swallowed."""
        if self.interrupted:
            raise KeyboardInterrupt

    def on_train_batch_end(self, batch, logs=None):
        self.check()

    def on_epoch_end(self, epoch, logs=None):
        self.check()

    def on_test_batch_end(self, batch, logs=None):
        self.check()

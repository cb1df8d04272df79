"""The model directory: its layout, atomic saving, and checked loading.

A model directory holds `config.json` (every setting, the package version, the vocabulary and
index hashes), `tokenizer.model`, `model.keras` (Keras 3 architecture + weights), `retrieval.json`
(the training pairs a model that reads retrieved answers looks up), `history.csv` and
`metrics.json`. It is written to a temporary sibling and renamed into place, so a crash never
leaves a half-written directory that loads. A kill can still leave debris beside it: temporaries
(named `.<name>.<pid>.<random>.tmp`, removed once that process is gone) and, in the middle of an
overwrite, the complete new directory as `.<name>.new` and the old one as `.<name>.old`;
`recover_model_dir` puts the right one back, and every save and every load of a missing
directory runs it first. Must not train.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import signal
from pathlib import Path
from typing import TYPE_CHECKING

from chatbot.config import ChatbotConfig, __version__

if TYPE_CHECKING:  # TensorFlow is imported only when a model is really saved or loaded,
    import keras   # so that checking a directory stays instant for the CLI.

    from chatbot.retrieval import Retriever
    from chatbot.tokenizer import Tokenizer

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
MODEL_FILE = "model.keras"  # the Keras model: architecture and weights
INDEX_FILE = "retrieval.json"  # the retrieval index (chatbot.retrieval), when config.context.retrieved > 0
HISTORY_FILE = "history.csv"
METRICS_FILE = "metrics.json"
REQUIRED_FILES = (CONFIG_FILE, TOKENIZER_FILE, MODEL_FILE)
KILL_AT = "CHATBOT_KILL_AT"  # test hook, see kill_point


class ArtifactError(ValueError):
    """A model directory that is missing, incomplete or made by an incompatible version."""


def kill_point(name: str) -> None:
    """Test hook: SIGKILL this process here when the environment variable CHATBOT_KILL_AT is `name`,
    so the kill tests can hit windows of a few microseconds (between two renames) every time."""
    if os.environ.get(KILL_AT) == name:
        os.kill(os.getpid(), getattr(signal, "SIGKILL", signal.SIGTERM))


def temp_path_beside(path: str | Path) -> Path:
    """A fresh name for a temporary beside `path`; the pid in it tells `remove_dead_temps` whose it is."""
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: someone else's process, alive
        return True
    return True


def remove_dead_temps(path: str | Path) -> None:
    """Remove the temporaries beside `path` whose process is gone (killed while writing). Names
    without a pid are from older versions, whose temporaries were all of dead processes by now."""
    path = Path(path)
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:(\d+)\.)?\w{{8}}\.tmp")
    try:
        entries = list(path.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if match and not (match[1] and _alive(int(match[1]))):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def discard_dir(path: str | Path) -> None:
    """Delete a directory so that a kill midway leaves no half of it under its own name: rename it
    to a temporary first (which the next `remove_dead_temps` of `path` finishes off)."""
    path = Path(path)
    if path.exists():
        trash = temp_path_beside(path)
        os.replace(path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it over: readers see old or new, never half."""
    path = Path(path)
    temp = temp_path_beside(path)
    try:
        with open(temp, "xb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def check_writable(out: str | Path) -> None:
    """Refuse an --out that cannot be created, before any work: inside a file, in a folder we may not
    write to, or a name too long for the file system (with room for the .training/.tmp siblings)."""
    out = Path(out)
    absolute = out.absolute()
    ancestor = absolute.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise ArtifactError(f"{out}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise ArtifactError(f"{out}: cannot write in {ancestor} (permission denied)")
    try:
        name_max, path_max = os.pathconf(ancestor, "PC_NAME_MAX"), os.pathconf(ancestor, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096
    room = 40  # ".<name>.training.<pid>.XXXXXXXX.tmp" beside it
    if any(len(os.fsencode(part)) + room > name_max for part in absolute.relative_to(ancestor).parts) \
            or len(os.fsencode(str(absolute))) + room > path_max:
        raise ArtifactError(f"{out}: the path or one of its names is too long for this file system")


def _swap_names(out_dir: Path) -> tuple[Path, Path]:
    return out_dir.with_name(f".{out_dir.name}.new"), out_dir.with_name(f".{out_dir.name}.old")


@contextlib.contextmanager
def _folder_lock(folder: Path):
    """Hold an exclusive lock on `folder` (its saves and recoveries take turns). The kernel drops it
    when the holder dies, so a kill never leaves it taken. No-op where there is no fcntl (Windows)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    handle = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)


def recover_model_dir(out_dir: str | Path) -> None:
    """Undo what a kill left around `out_dir`. If it is missing after a killed overwrite, the new
    directory (`.<name>.new`, complete before the swap began) takes its place, else the old one
    (`.<name>.old`) comes back; once `out_dir` exists, both are stale and go. Dead temporaries go too."""
    out_dir = Path(out_dir)
    if not out_dir.parent.is_dir():
        return
    new, old = _swap_names(out_dir)
    if new.exists() or old.exists():
        with _folder_lock(out_dir.parent):
            for candidate in (new, old):
                if not out_dir.exists() and candidate.is_dir():
                    try:
                        os.replace(candidate, out_dir)
                    except OSError as error:
                        raise ArtifactError(f"{out_dir} is missing; an interrupted save left it as {candidate}: "
                                            f"rename that back ({error.strerror})") from None
            if out_dir.exists():
                for stale in (new, old):
                    shutil.rmtree(stale, ignore_errors=True)
    remove_dead_temps(out_dir)


def save_model_dir(out_dir: str | Path, config: ChatbotConfig, tokenizer: "Tokenizer", model: "keras.Model",
                   extra_files: dict[str, bytes] | None = None, overwrite: bool = False,
                   extra_dirs: dict[str, Path] | None = None) -> Path:
    """Write a complete model directory at `out_dir` atomically (with copies of `extra_dirs`, by name).
    An existing one is replaced only with `overwrite=True`, and only after the new one is complete."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    recover_model_dir(out_dir)
    if out_dir.exists() and not overwrite:
        raise ArtifactError(f"{out_dir} already exists; choose another --out or pass --overwrite")
    temp = temp_path_beside(out_dir)
    temp.mkdir()
    new, old = _swap_names(out_dir)
    try:
        (temp / CONFIG_FILE).write_text(config.to_json(), encoding="utf-8")
        tokenizer.save(temp / TOKENIZER_FILE)
        model.save(temp / MODEL_FILE)
        for name, data in (extra_files or {}).items():
            (temp / name).write_bytes(data)
        for name, folder in (extra_dirs or {}).items():
            if Path(folder).is_dir():
                shutil.copytree(folder, temp / name)
        kill_point("save-written")
        with _folder_lock(out_dir.parent):
            if out_dir.exists():
                shutil.rmtree(new, ignore_errors=True)
                shutil.rmtree(old, ignore_errors=True)
                os.replace(temp, new)  # from here on, recover_model_dir may finish the swap
                os.replace(out_dir, old)
                kill_point("save-swapping")
                os.replace(new, out_dir)
            else:
                os.replace(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return out_dir


def check_model_dir(path: str | Path) -> ChatbotConfig:
    """Check a model directory without loading TensorFlow: all files present, same major.minor
    version, the tokenizer file matching the vocabulary hash in config.json."""
    path = Path(path)
    if not path.is_dir():
        recover_model_dir(path)  # a kill in the middle of an overwrite
    if not path.is_dir():
        raise ArtifactError(f"{path}: no model directory here (train one with `python -m chatbot train`)")
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise ArtifactError(f"{path}: not a complete model directory (missing {', '.join(missing)})")
    try:
        config = ChatbotConfig.read(path / CONFIG_FILE)
    except (ValueError, TypeError, AttributeError, KeyError) as error:  # bad JSON, wrong types, not an object
        detail = " ".join(str(error).split())[:200]
        raise ArtifactError(f"{path}: {CONFIG_FILE} is not a readable model config ({type(error).__name__}: "
                            f"{detail})") from None
    if config.version.split(".")[:2] != __version__.split(".")[:2]:
        raise ArtifactError(f"{path}: made by chatbot {config.version}, this is {__version__}; retrain it")
    proto = (path / TOKENIZER_FILE).read_bytes()
    if hashlib.sha256(proto).hexdigest() != config.tokenizer.vocab_hash:
        raise ArtifactError(f"{path}: {TOKENIZER_FILE} does not match the vocabulary hash in {CONFIG_FILE}")
    if config.context.retrieved:
        if not (path / INDEX_FILE).is_file():
            raise ArtifactError(f"{path}: not a complete model directory (missing {INDEX_FILE})")
        if hashlib.sha256((path / INDEX_FILE).read_bytes()).hexdigest() != config.context.index_hash:
            raise ArtifactError(f"{path}: {INDEX_FILE} does not match the index hash in {CONFIG_FILE}")
    return config


def load_model_dir(path: str | Path) -> tuple[ChatbotConfig, "Tokenizer", "keras.Model", "Retriever | None"]:
    """Check, then load a model directory: its config, tokenizer, model and retrieval index (None when
    the model reads no retrieved answers). The model loads with Keras safe mode on. Anything that does
    not load (a corrupt model.keras, an unreadable vocabulary or index) is an ArtifactError of one line."""
    import keras

    import chatbot.model  # noqa: F401  (registers the layers for deserialization)
    from chatbot.retrieval import Retriever
    from chatbot.tokenizer import Tokenizer

    config = check_model_dir(path)
    try:
        model = keras.saving.load_model(Path(path) / MODEL_FILE, compile=False, safe_mode=True)
        tokenizer = Tokenizer.load(Path(path) / TOKENIZER_FILE)
        retriever = Retriever.load(Path(path) / INDEX_FILE) if config.context.retrieved else None
    except Exception as error:
        detail = " ".join(str(error).split())[:300]
        raise ArtifactError(f"{path}: cannot load the model ({type(error).__name__}: {detail})") from error
    if not tokenizer.vocab_size == model.vocab_size == config.model.vocab_size:  # else every reply fails
        raise ArtifactError(f"{path}: {TOKENIZER_FILE} has {tokenizer.vocab_size} pieces but the model's embedding "
                            f"{model.vocab_size} (config.json: {config.model.vocab_size}); they are from different runs")
    return config, tokenizer, model, retriever

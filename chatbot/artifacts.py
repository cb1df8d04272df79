"""The model directory: its layout, atomic saving, and checked loading.

A model directory holds `config.json` (every setting, the package version, the vocabulary and
index hashes), `tokenizer.model`, `model.keras` (Keras 3 architecture + weights), `retrieval.json`
(the training pairs a model that reads retrieved answers looks up), `history.csv` and `metrics.json`. It is written to a temporary sibling and renamed into place, so a crash never
leaves a half-written directory that loads. Must not train.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
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


class ArtifactError(ValueError):
    """A model directory that is missing, incomplete or made by an incompatible version."""


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename it over: readers see old or new, never half."""
    path = Path(path)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
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
    room = 32  # ".<name>.XXXXXXXX.tmp" and "<name>.training.new" beside it
    if any(len(os.fsencode(part)) + room > name_max for part in absolute.relative_to(ancestor).parts) \
            or len(os.fsencode(str(absolute))) + room > path_max:
        raise ArtifactError(f"{out}: the path or one of its names is too long for this file system")


def save_model_dir(out_dir: str | Path, config: ChatbotConfig, tokenizer: "Tokenizer", model: "keras.Model",
                   extra_files: dict[str, bytes] | None = None, overwrite: bool = False) -> Path:
    """Write a complete model directory at `out_dir` atomically. An existing one is replaced only
    with `overwrite=True`, and only after the new one is complete."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise ArtifactError(f"{out_dir} already exists; choose another --out or pass --overwrite")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    temp = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.", suffix=".tmp"))
    try:
        (temp / CONFIG_FILE).write_text(config.to_json(), encoding="utf-8")
        tokenizer.save(temp / TOKENIZER_FILE)
        model.save(temp / MODEL_FILE)
        for name, data in (extra_files or {}).items():
            (temp / name).write_bytes(data)
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(temp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(temp, out_dir)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return out_dir


def check_model_dir(path: str | Path) -> ChatbotConfig:
    """Check a model directory without loading TensorFlow: all files present, same major.minor
    version, the tokenizer file matching the vocabulary hash in config.json."""
    path = Path(path)
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

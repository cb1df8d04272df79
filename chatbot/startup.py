"""Loading TensorFlow and a model without their start-up noise.

Owns: `import_tensorflow_quietly`, which the CLI and the web app call before their first TensorFlow use,
`native_notes_quieted`, which `chatbot.tokenizer.subword` wraps around making a SentencePiece op, and
`keras_extras_left_out`, which keeps the CLI's import of Keras lean. TensorFlow prints
lines before its logging is set up ("All log messages before absl::InitializeLog()", oneDNN and CUDA-driver notes, and on a
machine without a GPU "failed call to cuInit"), and SentencePiece notes how it normalises when a tokenizer is
made ("normalizer.cc(51) LOG(INFO) precompiled_charsmap is empty"); newcomers read them as failures. They are
written by C++ straight to the process's standard error, so those steps run with that stream captured; every
captured line that is not such a note is printed afterwards, so real errors still show (and a Python exception
is raised as usual). Later C++ log lines follow TF_CPP_MIN_LOG_LEVEL, 3 unless set (0 shows them all).
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

START_UP_NOTES = re.compile(r"All log messages before absl::InitializeLog|^[IW]\d{4} |cuInit|cuda_platform|"
                            r"cudart_stub|oneDNN|rebuild TensorFlow with the appropriate compiler flags|"
                            r"TensorFlow binary is optimized|^\S+\.cc\(\d+\) LOG\(INFO\) ")
KERAS_EXTRAS = ("IPython", "matplotlib", "pandas")  # what `keras_extras_left_out` leaves out


@contextlib.contextmanager
def native_notes_quieted(notes: re.Pattern = START_UP_NOTES):
    """Run the block with the process's standard error (file descriptor 2) captured; then print every
    captured line that `notes` does not match. Lines other threads write meanwhile come out afterwards."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip() and not notes.search(line):
                    print(line, file=sys.stderr)


def import_tensorflow_quietly(find_devices: bool = True, lean: bool = False) -> None:
    """Import TensorFlow and TensorFlow Text (and, with `find_devices`, look for GPUs, which is when the
    CUDA note appears; a multi-worker run must not, as its strategy has to come first). `lean`: Keras
    without the optional modules it imports with itself (`keras_extras_left_out`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ log lines off after start-up too (oneDNN notes)
    with native_notes_quieted(), keras_extras_left_out(KERAS_EXTRAS if lean else ()):
        import tensorflow as tf
        import tensorflow_text  # noqa: F401  (its ops load more of the same notes)

        if find_devices:
            tf.config.list_physical_devices("GPU")


@contextlib.contextmanager
def keras_extras_left_out(modules=KERAS_EXTRAS):
    """Within the block, `modules` that are not imported yet cannot be: Keras, imported by TensorFlow, then
    goes without them, as it does where they are not installed. It imports IPython (to show files in a
    notebook), matplotlib.pyplot (image galleries) and pandas (DataFrames given to `fit`) if it can, which
    is a second of a one-question `chat -q`, and the command line uses none of those. Afterwards each can be
    imported as usual, for our own code's use."""
    left_out = [name for name in modules if name not in sys.modules]
    for name in left_out:
        sys.modules[name] = None  # the import system's "known to be missing"
    try:
        yield
    finally:
        for name in left_out:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]

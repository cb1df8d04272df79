"""Loading TensorFlow without its start-up noise.

Owns: `import_tensorflow_quietly`, which the CLI and the web app call before their first TensorFlow use.
TensorFlow prints lines before its logging is set up ("All log messages before absl::InitializeLog()",
oneDNN and CUDA-driver notes, and on a machine without a GPU "failed call to cuInit"), which newcomers read
as failures. They are written by C++ straight to the process's standard error, so the import runs with that
stream captured; every captured line that is not such a note is printed afterwards, so real errors still show
(and a Python exception is raised as usual). Later C++ log lines follow TF_CPP_MIN_LOG_LEVEL, 3 unless set
(TF_CPP_MIN_LOG_LEVEL=0 shows them all).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

START_UP_NOTES = re.compile(r"All log messages before absl::InitializeLog|^[IW]\d{4} |cuInit|cuda_platform|"
                            r"cudart_stub|oneDNN|rebuild TensorFlow with the appropriate compiler flags|"
                            r"TensorFlow binary is optimized")


def import_tensorflow_quietly(find_devices: bool = True) -> None:
    """Import TensorFlow and TensorFlow Text (and, with `find_devices`, look for GPUs, which is when the
    CUDA note appears; a multi-worker run must not, as its strategy has to come first)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")  # C++ log lines off after start-up too (oneDNN notes)
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (its ops load more of the same notes)

            if find_devices:
                tf.config.list_physical_devices("GPU")
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode("utf-8", "replace").splitlines():
                if line.strip() and not START_UP_NOTES.search(line):
                    print(line, file=sys.stderr)

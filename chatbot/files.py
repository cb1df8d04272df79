"""Writing files so that a crash or a kill never leaves half of one: temporaries beside the target, renamed into
place, and the debris of a killed writer removed by the next one.

Owns: `atomic_write_bytes`, `temp_path_beside`, `remove_dead_temps`, `discard_dir` and the kill test hook. Used by
the model directory (`chatbot.artifacts`), the run directory and the download. Must not know what a model is.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
from pathlib import Path

KILL_AT = "CHATBOT_KILL_AT"  # test hook, see kill_point


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

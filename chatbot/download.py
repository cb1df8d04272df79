"""Fetching the public ChatbotData.csv (songys/Chatbot_data, MIT licence).

Owns: the address, the expected SHA-256, the download with a progress line, and the atomic
write. The project never ships that file; users fetch it with `python -m chatbot download`.
Must not import TensorFlow.
"""

from __future__ import annotations

import hashlib
import sys
import urllib.error
import urllib.request
from pathlib import Path

from chatbot.artifacts import atomic_write_bytes

CHATBOT_DATA_URL = "https://raw.githubusercontent.com/songys/Chatbot_data/master/ChatbotData.csv"
CHATBOT_DATA_SHA256 = "332948dd797b3a6b2ad23cfd860181ac476936311e4a5cc14d2c676a3a1310ac"
CHUNK = 64 * 1024


class DownloadError(Exception):
    """The file could not be fetched or is not the expected one; nothing was written."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fetch(url: str, timeout: float = 30.0, progress=sys.stderr) -> bytes:
    """The body at `url`, with a one-line progress counter on `progress` (None: silent)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0)
            chunks, received = [], 0
            while chunk := response.read(CHUNK):
                chunks.append(chunk)
                received += len(chunk)
                if progress is not None:
                    of_total = f" / {total / 1e6:.1f}" if total else ""
                    print(f"\rdownloading {received / 1e6:.1f}{of_total} MB", end="", file=progress, flush=True)
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise DownloadError(f"cannot download {url}: {reason} (are you online?)") from None
    finally:
        if progress is not None:
            print(file=progress, flush=True)
    return b"".join(chunks)


def download_chatbot_data(out: str | Path, *, overwrite: bool = False, url: str | None = None,
                          sha256: str | None = None, progress=sys.stderr) -> Path:
    """Download ChatbotData.csv to `out`, check its SHA-256, and write it atomically. Returns `out`."""
    out, url, sha256 = Path(out), url or CHATBOT_DATA_URL, (sha256 or CHATBOT_DATA_SHA256).strip().lower()
    if out.exists() and not overwrite:
        raise DownloadError(f"{out} already exists; pass --overwrite to replace it")
    data = fetch(url, progress=progress)
    digest = sha256_hex(data)
    if digest != sha256:
        raise DownloadError(f"checksum mismatch for {url}: expected sha256 {sha256}, got {digest}; nothing written "
                            f"(if upstream changed the file and you trust it: --sha256 {digest})")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)
    return out

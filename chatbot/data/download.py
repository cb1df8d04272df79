"""Fetching the public ChatbotData.csv (songys/Chatbot_data, MIT licence).

Owns: the address, the expected size and SHA-256 of the public file (the same line as the TFDS
builder's `checksums.tsv`; a test keeps them equal), the download with a progress line, and the
atomic write of a plain CSV that `train --data` reads. The project never ships that file; users
fetch it with `python -m chatbot download`, or let TFDS fetch it (`train --data tfds:korean_chatbot_data`).
Must not import TensorFlow.
"""

from __future__ import annotations

import hashlib
import sys
import urllib.error
import urllib.request
from pathlib import Path

from chatbot.files import atomic_write_bytes

CHATBOT_DATA_URL = "https://raw.githubusercontent.com/songys/Chatbot_data/master/ChatbotData.csv"
CHATBOT_DATA_SIZE = 889_842  # bytes; 11,823 Q,A,label rows
CHATBOT_DATA_SHA256 = "287eb129695b577321c80ad397bb3c2279164d4ca577874d129fd3db5b30afe2"
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
        raise DownloadError(f"cannot download {url}: {reason}") from None
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
    try:
        data = fetch(url, progress=progress)
    except DownloadError as error:
        raise DownloadError(f"{error}; offline, fetch the file on a machine with internet, then check and "
                            f"copy it here with --url file:///path/to/ChatbotData.csv") from None
    digest = sha256_hex(data)
    if digest != sha256:
        pinned = f" ({CHATBOT_DATA_SIZE:,} bytes)" if sha256 == CHATBOT_DATA_SHA256 else ""
        raise DownloadError(f"checksum mismatch for {url}: expected sha256 {sha256}{pinned}, got {digest} "
                            f"({len(data):,} bytes); nothing written "
                            f"(if upstream changed the file and you trust it: --sha256 {digest})")
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out, data)
    return out

"""`python -m chatbot download`: checksum, atomic write, offline error. Never touches the network:
the source is a local file:// address or a closed local port."""

import hashlib

import pytest

from chatbot.cli import main as cli
from chatbot.data import download
from chatbot.data.download import DownloadError, download_chatbot_data
from conftest import ROOT

CSV = "Q,A,label\n12시 땡!,하루가 또 가네요.,0\n".encode()
CLOSED_PORT = "http://127.0.0.1:9/ChatbotData.csv"  # the discard port: refused at once, no network


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "upstream.csv"
    path.write_bytes(CSV)
    return path.as_uri(), hashlib.sha256(CSV).hexdigest()


def test_a_matching_checksum_writes_the_file(source, tmp_path):
    url, digest = source
    out = download_chatbot_data(tmp_path / "data" / "ChatbotData.csv", url=url, sha256=digest, progress=None)
    assert out.read_bytes() == CSV


def test_a_wrong_checksum_writes_nothing(source, tmp_path):
    url, _ = source
    out = tmp_path / "ChatbotData.csv"
    with pytest.raises(DownloadError, match="checksum mismatch"):
        download_chatbot_data(out, url=url, sha256="0" * 64, progress=None)
    assert list(tmp_path.iterdir()) == [tmp_path / "upstream.csv"]  # no file, no temporary left over


def test_an_existing_file_is_kept_unless_overwrite(source, tmp_path):
    url, digest = source
    out = tmp_path / "ChatbotData.csv"
    out.write_text("mine", encoding="utf-8")
    with pytest.raises(DownloadError, match="already exists"):
        download_chatbot_data(out, url=url, sha256=digest, progress=None)
    assert out.read_text(encoding="utf-8") == "mine"
    download_chatbot_data(out, url=url, sha256=digest, overwrite=True, progress=None)
    assert out.read_bytes() == CSV


PUBLIC_SHA256 = "287eb129695b577321c80ad397bb3c2279164d4ca577874d129fd3db5b30afe2"  # songys/Chatbot_data master


def test_the_pinned_checksum_is_the_public_file_in_both_places():
    assert (download.CHATBOT_DATA_SHA256, download.CHATBOT_DATA_SIZE) == (PUBLIC_SHA256, 889_842)
    line = (ROOT / "chatbot" / "data" / "datasets" / "korean_chatbot_data" / "checksums.tsv").read_text(encoding="utf-8")
    assert line.split("\t") == [download.CHATBOT_DATA_URL, "889842", PUBLIC_SHA256, "ChatbotData.csv\n"]


def test_the_shared_subset_is_not_taken_for_the_public_file(shared_chatbot_data):
    assert hashlib.sha256(shared_chatbot_data.read_bytes()).hexdigest() != download.CHATBOT_DATA_SHA256


def test_offline_the_cli_prints_one_error_line_and_exits_2(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(download, "CHATBOT_DATA_URL", CLOSED_PORT)
    out = tmp_path / "ChatbotData.csv"
    assert cli.main(["download", "--out", str(out)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: cannot download") and "--url file://" in errors[0]
    assert not out.exists()


def test_a_copy_brought_offline_is_checked_and_written(source, tmp_path, capsys):
    url, digest = source
    out = tmp_path / "ChatbotData.csv"
    assert cli.main(["download", "--out", str(out), "--url", url, "--sha256", digest]) == 0
    assert out.read_bytes() == CSV


def test_a_changed_upstream_file_names_the_flag_that_accepts_it(monkeypatch, source, tmp_path, capsys):
    url, digest = source
    monkeypatch.setattr(download, "CHATBOT_DATA_URL", url)
    out = tmp_path / "ChatbotData.csv"
    assert cli.main(["download", "--out", str(out)]) == 2  # the pinned checksum is not this file's
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: checksum mismatch") and f"--sha256 {digest}" in error
    assert not out.exists()
    assert cli.main(["download", "--out", str(out), "--sha256", digest.upper()]) == 0
    assert out.read_bytes() == CSV

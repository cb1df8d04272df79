"""The `korean_chatbot_data` TFDS builder and `load_source`: TFDS's own builder tests on the dummy
file, the opt-in for a local file, the checksum refusal, the real download path against a local
server with its own registered checksum, and CSV/TFDS giving the same pairs. No network."""

import hashlib
import http.server
import threading
from pathlib import Path

import pytest
import tensorflow_datasets as tfds
from tensorflow_datasets.core.download import checksums

import chatbot.data.datasets.korean_chatbot_data.korean_chatbot_data_dataset_builder as builder_module
from chatbot.config import DataConfig
from chatbot.data.pairs import DataError, load_pairs, split_by_question
from chatbot.data.datasets import load_source
from chatbot.data.datasets.korean_chatbot_data import KoreanChatbotData
from chatbot.data.download import CHATBOT_DATA_SHA256
from conftest import SHARED_CHATBOT_DATA

DUMMY_DIR = Path(builder_module.__file__).parent / "dummy_data"
DUMMY = DUMMY_DIR / "ChatbotData.csv"
DUMMY_SPLITS = {"train": 18, "validation": 2}  # 21 rows, one with an empty answer; 19 questions, 2 held out


class KeepKernelCache:
    """TFDS's builder test cases without tf.test.TestCase's `tf.random.set_seed` in setUp, which clears
    TensorFlow's kernel cache and with it the SentencePiece resource of every model this process has
    loaded (the session's shared bots: pytest-xdist runs the files in any order)."""

    def setUp(self):
        self._set_default_seed = False
        super().setUp()


class LocalConfigTest(KeepKernelCache, tfds.testing.DatasetBuilderTestCase):
    """`korean_chatbot_data/local` reads the manual dir's ChatbotData.csv, whatever it is."""

    DATASET_CLASS = KoreanChatbotData
    BUILDER_CONFIG_NAMES_TO_TEST = ["local"]
    SPLITS = DUMMY_SPLITS


class PublicConfigTest(KeepKernelCache, tfds.testing.DatasetBuilderTestCase):
    """The default config downloads the registered URL (mocked here) when the manual dir has no file."""

    DATASET_CLASS = KoreanChatbotData
    BUILDER_CONFIG_NAMES_TO_TEST = ["public"]
    EXAMPLE_DIR = DUMMY_DIR / "download"
    DL_DOWNLOAD_RESULT = "master.csv"
    SPLITS = DUMMY_SPLITS


def test_the_public_config_refuses_another_file_naming_the_expected_checksum(tmp_path):
    builder = tfds.builder("korean_chatbot_data", data_dir=tmp_path)
    with pytest.raises(DataError) as error:
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=DUMMY_DIR))
    message = str(error.value)
    assert CHATBOT_DATA_SHA256 in message and hashlib.sha256(DUMMY.read_bytes()).hexdigest() in message
    assert "korean_chatbot_data/local" in message


def test_the_local_config_without_a_file_says_where_to_put_it(tmp_path):
    with pytest.raises(DataError, match="manual dir"):
        load_source("tfds:korean_chatbot_data/local", data_dir=tmp_path / "tfds", manual_dir=tmp_path / "empty")


def test_tfds_and_csv_give_the_same_pairs_in_the_same_order(tmp_path):
    pairs, report = load_source("tfds:korean_chatbot_data/local", data_dir=tmp_path, manual_dir=DUMMY_DIR)
    csv_pairs, csv_report = load_pairs(DUMMY)
    assert pairs == csv_pairs
    assert report.dropped_duplicates == csv_report.dropped_duplicates == [5]  # rows are the CSV's lines
    assert report.label_counts == csv_report.label_counts
    assert pairs[15].label == 2  # the "2   " label, cleaned
    assert str(report).startswith("data: tfds:korean_chatbot_data/local (TFDS korean_chatbot_data/local/1.0.0)")


def test_the_validation_split_is_the_one_train_holds_out(tmp_path):
    builder = tfds.builder("korean_chatbot_data/local", data_dir=tmp_path)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=DUMMY_DIR))
    held_out = {ex["question"].decode() for ex in tfds.as_numpy(builder.as_dataset(split="validation"))}
    from chatbot.config import VAL_FRACTION  # what `train` holds out of 1,000 pairs or more, as of ChatbotData

    _, val = split_by_question(load_pairs(DUMMY)[0], VAL_FRACTION, DataConfig().seed)
    assert held_out == {p.question for p in val} and held_out
    assert "songys/Chatbot_data" in builder.info.citation and builder.info.supervised_keys == ("question", "answer")


def test_a_csv_path_goes_to_load_pairs():
    assert load_source(DUMMY) == load_pairs(DUMMY)


def test_an_unknown_tfds_name_is_a_data_error():
    with pytest.raises(DataError, match="tfds:no_such_set: not a TFDS dataset"):
        load_source("tfds:no_such_set")


@pytest.fixture
def served(tmp_path):
    """The dummy file over HTTP on 127.0.0.1 (a stand-in for the upstream address)."""
    root = tmp_path / "www"
    root.mkdir()
    (root / "ChatbotData.csv").write_bytes(DUMMY.read_bytes())

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(root), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/ChatbotData.csv"
    server.shutdown()
    server.server_close()


def register(monkeypatch, url, digest):
    monkeypatch.setattr(KoreanChatbotData, "URL", url)
    info = checksums.UrlInfo(size=DUMMY.stat().st_size, checksum=digest, filename="ChatbotData.csv")
    monkeypatch.setattr(KoreanChatbotData, "url_infos", {url: info})


def test_the_download_path_checks_the_registered_checksum(monkeypatch, served, tmp_path):
    register(monkeypatch, served, hashlib.sha256(DUMMY.read_bytes()).hexdigest())
    pairs, report = load_source("tfds:korean_chatbot_data", data_dir=tmp_path / "tfds", manual_dir=tmp_path / "none")
    assert report.rows_read == sum(DUMMY_SPLITS.values()) and pairs == load_pairs(DUMMY)[0]

    register(monkeypatch, served, "0" * 64)
    with pytest.raises(DataError, match="not the file this package pinned"):
        load_source("tfds:korean_chatbot_data", data_dir=tmp_path / "tfds2", manual_dir=tmp_path / "none")


def test_offline_the_tfds_source_says_where_to_put_the_file(monkeypatch, tmp_path):
    monkeypatch.setattr("tensorflow_datasets.core.download.downloader.MAX_RETRIES", 0)
    register(monkeypatch, "http://127.0.0.1:9/ChatbotData.csv", "0" * 64)  # the discard port: refused at once
    with pytest.raises(DataError, match="cannot download") as error:
        load_source("tfds:korean_chatbot_data", data_dir=tmp_path / "tfds", manual_dir=tmp_path / "manual")
    assert str(tmp_path / "manual") in str(error.value)


@pytest.mark.skipif(not SHARED_CHATBOT_DATA.exists(), reason="../shared/data/ChatbotData.csv not present")
def test_the_shared_subset_builds_with_the_opt_in_and_is_refused_without(tmp_path):
    manual = SHARED_CHATBOT_DATA.parent
    with pytest.raises(DataError, match=CHATBOT_DATA_SHA256):
        load_source("tfds:korean_chatbot_data", data_dir=tmp_path, manual_dir=manual)
    builder = tfds.builder("korean_chatbot_data/local", data_dir=tmp_path)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=manual))
    rows = sum(split.num_examples for split in builder.info.splits.values())
    assert rows == 11321  # every row of the file (none is empty); load_pairs then drops 73 duplicates



def test_train_with_an_unknown_tfds_name_prints_one_error_line(tmp_path, capsys):
    from chatbot.cli import main as cli

    assert cli.main(["train", "--data", "tfds:no_such_set", "--out", str(tmp_path / "m")]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "tfds:no_such_set" in errors[0] and "korean_chatbot_data" in errors[0]
    assert not (tmp_path / "m").exists()

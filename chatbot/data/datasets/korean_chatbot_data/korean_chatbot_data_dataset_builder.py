"""`korean_chatbot_data`: the public ChatbotData.csv (songys/Chatbot_data, MIT) as a TFDS dataset.

Owns: the features, the two configs, where the file comes from, and the train/validation split.
- `public` (default): the published file. TFDS downloads it and checks its size and SHA-256 against
  `checksums.tsv`; a `ChatbotData.csv` in the manual dir is used instead when it has that checksum,
  and refused with a message naming the checksum when it has not.
- `local`: the explicit opt-in for any `ChatbotData.csv` in the manual dir (a subset, an older
  copy, your own Q,A,label file); never downloaded, never checked. It is prepared under its own
  name, so a subset is never mistaken for the public set.
Rows are read and cleaned by `chatbot.data.pairs` (encodings, label cleanup, empty rows dropped; duplicate
rows kept, as published). `validation` holds the questions `chatbot.training.train` holds out with the
default `DataConfig`, so training on `train` + `validation` re-draws exactly these two sides.
Must not tokenize or import the model.
"""

from __future__ import annotations

import hashlib

import tensorflow as tf
import tensorflow_datasets as tfds

from chatbot.config import VAL_FRACTION, DataConfig
from chatbot.data.pairs import DataError, clean_rows, read_rows, split_by_question
from chatbot.data.download import CHATBOT_DATA_URL

FILE_NAME = "ChatbotData.csv"
LABEL_NAMES = ("everyday", "sad", "love")  # the CSV's 0, 1, 2


class KoreanChatbotData(tfds.core.GeneratorBasedBuilder):
    """Korean chatbot Q&A pairs (songys/Chatbot_data): question, answer, tone label."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "ChatbotData.csv of songys/Chatbot_data (master), question-disjoint validation."}
    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(name="public", description="The published file, checksum-verified."),
        tfds.core.BuilderConfig(name="local", description="Any ChatbotData.csv in the manual dir, unchecked "
                                                          "(the opt-in for a local subset)."),
    ]
    URL = CHATBOT_DATA_URL
    MANUAL_DOWNLOAD_INSTRUCTIONS = f"""
    Without internet, put the public ChatbotData.csv ({CHATBOT_DATA_URL}) in the manual dir
    (default `~/tensorflow_datasets/downloads/manual/`; `DownloadConfig(manual_dir=...)` or
    `tfds build --manual_dir` choose another). It must have the SHA-256 in this builder's checksums.tsv.
    For a different file (a subset, your own Q,A,label CSV) opt in with the `local` config:
    `tfds.builder("korean_chatbot_data/local")`.
    """

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="Korean everyday-conversation Q&A pairs written for chatbot tutorials. "
                        "label: 0 everyday, 1 sad/breakup, 2 love/positive. "
                        "row: the pair's line in the CSV (the header is line 1).",
            features=tfds.features.FeaturesDict({
                "question": tfds.features.Text(),
                "answer": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=LABEL_NAMES),  # -1 where the CSV has no usable label
                "row": tfds.features.Scalar(dtype=tf.int32),
            }),
            supervised_keys=("question", "answer"),
            disable_shuffling=True,  # file order, so loading it again gives the CSV's pairs in the CSV's order
            homepage="https://github.com/songys/Chatbot_data",
            license="MIT License, Copyright (c) 2018 Youngsook Song",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        path = self._source_file(dl_manager)
        rows, encoding = read_rows(path)
        pairs, report = clean_rows(path, rows, encoding, keep_duplicates=True)
        dropped = set(report.dropped_empty)
        examples = list(zip((row[0] for row in rows if row[0] not in dropped), pairs))
        data = DataConfig(val_fraction=VAL_FRACTION)  # what `train` holds out of 1,000 pairs or more
        _, held_out = split_by_question(pairs, data.val_fraction, data.seed)
        held_out = {pair.question for pair in held_out}
        return {
            "train": self._generate_examples([e for e in examples if e[1].question not in held_out]),
            "validation": self._generate_examples([e for e in examples if e[1].question in held_out]),
        }

    def _source_file(self, dl_manager):
        manual = self._manual_file(dl_manager)
        if self.builder_config.name == "local":
            if manual is None:
                raise DataError(FILE_NAME, f"korean_chatbot_data/local reads {FILE_NAME} from the manual dir, "
                                           "and there is none: put the file there or pass manual_dir")
            return manual
        if manual is None:
            return dl_manager.download(self.URL)  # size and SHA-256 checked against checksums.tsv
        expected = self.url_infos[self.URL].checksum
        actual = hashlib.sha256(manual.read_bytes()).hexdigest()
        if actual != expected:
            raise DataError(manual, f"SHA-256 {actual} is not the public ChatbotData.csv's ({expected}); "
                                    "use the public file, or opt in to this one with the local config "
                                    "(tfds.builder('korean_chatbot_data/local'), "
                                    "train --data tfds:korean_chatbot_data/local)")
        return manual

    @staticmethod
    def _manual_file(dl_manager):
        try:
            path = dl_manager.manual_dir / FILE_NAME
        except AssertionError:  # the manual dir does not exist or is empty
            return None
        return path if path.exists() else None

    def _generate_examples(self, examples):
        for line, pair in examples:
            label = -1 if pair.label is None else pair.label
            yield line, {"question": pair.question, "answer": pair.answer, "label": label, "row": line}

"""Where training data comes from: a Q&A CSV (the main door) or a TFDS dataset (`tfds:NAME[/CONFIG]`).

Owns: `load_source(spec) -> (pairs, report)` for both, `load_sources` for several at once, and this package's TFDS builders
(`chatbot.data.datasets.korean_chatbot_data`, registered when imported). Importing this package stays
light: tensorflow-datasets and TensorFlow load only for a `tfds:` spec or with a builder.
Must not tokenize.
"""

from __future__ import annotations

from pathlib import Path

from chatbot.data.pairs import DataError, DataReport, QAPair, clean_rows, load_pairs, merge_pairs

TFDS_PREFIX = "tfds:"
BUILT_IN = "korean_chatbot_data"


def is_tfds(spec) -> bool:
    return str(spec).startswith(TFDS_PREFIX)


def load_source(spec: str | Path, *, data_dir: str | None = None,
                manual_dir: str | None = None) -> tuple[list[QAPair], DataReport]:
    """Clean pairs and a data report from a CSV path or a `tfds:` spec such as `tfds:korean_chatbot_data`.

    A TFDS dataset is downloaded and prepared first if needed (`data_dir` and `manual_dir` as in
    TFDS; None: its defaults). Its pairs come back in file order, cleaned as a CSV would be.
    """
    if not is_tfds(spec):
        return load_pairs(spec)
    return _load_tfds(str(spec), data_dir, manual_dir)


def load_sources(specs: list[str], log=print) -> list[QAPair]:
    """Pairs of every source in order, logging each one's data report (and a total for several);
    a pair that repeats an earlier source's is dropped."""
    loaded = []
    for spec in specs:
        pairs, report = load_source(spec)
        log(report)
        loaded.append(pairs)
    pairs, repeated = merge_pairs(loaded)
    if len(specs) > 1:
        log(f"total: {len(pairs)} pairs from {len(specs)} files ({repeated} pairs repeated an earlier file's "
            "and were dropped)")
    return pairs


def _load_tfds(spec: str, data_dir, manual_dir) -> tuple[list[QAPair], DataReport]:
    import requests
    import tensorflow_datasets as tfds
    from tensorflow_datasets.core.download.download_manager import NonMatchingChecksumError

    import chatbot.data.datasets.korean_chatbot_data  # noqa: F401  (registers the builder)

    name = spec[len(TFDS_PREFIX):]
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except (tfds.core.registered.DatasetNotFoundError, ValueError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise DataError(spec, f"not a TFDS dataset here ({first}); this package provides {BUILT_IN} "
                              f"(configs public, local)") from None
    if not {"question", "answer"} <= set(builder.info.features.keys()):
        raise DataError(spec, "the dataset has no question and answer features")
    config = tfds.download.DownloadConfig(manual_dir=manual_dir)
    try:
        builder.download_and_prepare(download_config=config)
    except (requests.exceptions.RequestException, tfds.download.DownloadError) as error:
        manual = Path(manual_dir) if manual_dir else Path(builder.data_dir_root) / "downloads" / "manual"
        raise DataError(spec, f"cannot download it ({type(error).__name__}: are you online?); without internet, "
                              f"copy the public ChatbotData.csv into {manual}") from None
    except NonMatchingChecksumError as error:
        raise DataError(spec, f"the download is not the file this package pinned: {error}") from None

    dataset = builder.as_dataset(split="+".join(builder.info.splits.keys()))
    rows = []
    for index, example in enumerate(tfds.as_numpy(dataset)):
        label = int(example.get("label", -1))
        rows.append((int(example.get("row", index)), example["question"].decode("utf-8"),
                     example["answer"].decode("utf-8"), None if label < 0 else label))
    rows.sort(key=lambda row: row[0])
    return clean_rows(spec, rows, f"TFDS {builder.info.full_name}")

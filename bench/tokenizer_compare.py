"""SentencePiece (what the package uses) vs tensorflow-text's WordPiece vs the seed tutorial's
`tfds.deprecated.text.SubwordTextEncoder`, measured side by side.

For each tokenizer, learned from the same training split: round-trip fidelity of
detokenize(tokenize(text)) on every question and answer (against the text as the user wrote it),
tokens per sentence, tokenize speed over all questions and answers, and the validation loss after
the same short training of the same model. Loss per token depends on how finely a tokenizer cuts,
so the comparable figure is nats per validation answer (the sum over its tokens).

    python bench/tokenizer_compare.py [--data CSV] [--epochs 5] [--vocab-size 8000]

Data: ../shared/data/ChatbotData.csv when present, else the bundled data/korean_chat.csv.
"""

import argparse
import re
import time

from common import DEFAULT_DATA

WORDPIECE_RESERVED = ["[PAD]", "[START]", "[END]", "[UNK]"]  # the package's ids 0..3
TUTORIAL_VOCAB_SIZE = 2**13  # the seed tutorial's target_vocab_size


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--epochs", type=int, default=5, help="training epochs per tokenizer")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--batch-size", type=int, default=64)
    return parser.parse_args()


class WordPiece:
    """tensorflow-text's BERT WordPiece with cased text (lower_case=True would NFD-split Hangul into jamo)."""

    def __init__(self, texts, vocab_size):
        import tensorflow as tf
        import tensorflow_text as tf_text
        from tensorflow_text.tools.wordpiece_vocab.bert_vocab_from_dataset import bert_vocab_from_dataset

        params = dict(lower_case=False)
        vocab = bert_vocab_from_dataset(tf.data.Dataset.from_tensor_slices(texts).batch(1000), vocab_size,
                                        WORDPIECE_RESERVED, bert_tokenizer_params=params)
        table = tf.lookup.StaticVocabularyTable(
            tf.lookup.KeyValueTensorInitializer(vocab, tf.range(len(vocab), dtype=tf.int64)), num_oov_buckets=1)
        self.tf, self.vocab_size = tf, len(vocab) + 1
        self.bert = tf_text.BertTokenizer(table, token_out_type=tf.int32, unknown_token="[UNK]", **params)

    def tokenize(self, texts):
        return self.bert.tokenize(self.tf.constant(texts)).merge_dims(-2, -1)

    def detokenize_texts(self, ids):
        words = self.bert.detokenize(ids)
        return [s.decode("utf-8") for s in self.tf.strings.reduce_join(words, axis=-1, separator=" ").numpy()]


class TutorialSubword:
    """The seed tutorial's tokenizer: spaces around ? . ! , then tfds' SubwordTextEncoder (2**13 target).

    Its ids start at 1 (0 is padding); they are shifted by 2 so the package's start/end ids (1, 2) stay free.
    """

    SHIFT = 2

    def __init__(self, texts):
        import tensorflow as tf
        import tensorflow_datasets as tfds

        self.tf = tf
        self.encoder = tfds.deprecated.text.SubwordTextEncoder.build_from_corpus(
            [self.preprocess(t) for t in texts], target_vocab_size=TUTORIAL_VOCAB_SIZE)
        self.vocab_size = self.encoder.vocab_size + self.SHIFT

    @staticmethod
    def preprocess(text):
        return re.sub(r"([?.!,])", r" \1 ", text).strip()

    def tokenize(self, texts):
        ids = [[i + self.SHIFT for i in self.encoder.encode(self.preprocess(t))] for t in texts]
        return self.tf.ragged.constant(ids, dtype=self.tf.int32)

    def detokenize_texts(self, ids):
        return [self.encoder.decode([i - self.SHIFT for i in row]) for row in ids.to_list()]


def sentences_per_second(texts, tokenize):
    tokenize(texts[:64])  # warm up: graph tracing and resource creation are not tokenizing
    start = time.perf_counter()
    tokenize(texts)
    return len(texts) / (time.perf_counter() - start)


def fidelity(texts, tokenize, detokenize):
    ids = tokenize(texts)
    back = detokenize(ids)
    lengths = ids.row_lengths().numpy()
    same = sum(a == b for a, b in zip(texts, back))
    example = next(((a, b) for a, b in zip(texts, back) if a != b), None)
    return same / len(texts), float(lengths.mean()), example


def validation_nats(tokenize, vocab_size, train_pairs, val_pairs, args):
    """Mean masked loss per token and per answer on the validation split after a short training."""
    import keras
    import numpy as np

    from chatbot.training.losses import MaskedAccuracy, MaskedSparseCrossEntropy
    from chatbot.model.transformer import Transformer
    from chatbot.training.optimizer import transformer_optimizer
    from chatbot.training.batches import make_dataset

    def dataset(pairs, shuffle):
        return make_dataset(tokenize([p.question for p in pairs]), tokenize([p.answer for p in pairs]),
                            max_length=40, batch_size=args.batch_size, shuffle=shuffle)

    train, val = dataset(train_pairs, True), dataset(val_pairs, False)
    keras.utils.set_random_seed(0)  # after tokenizing: it also drops TensorFlow's SentencePiece resources
    model = Transformer(vocab_size, num_layers=2, dropout=0.0)
    model.compile(optimizer=transformer_optimizer(128, 1000), loss=MaskedSparseCrossEntropy(),
                  metrics=[MaskedAccuracy()])
    model.fit(train, epochs=args.epochs, verbose=2, shuffle=False)  # the dataset shuffles itself
    loss, _ = model.evaluate(val, verbose=0)
    tokens = sum(int(np.count_nonzero(targets)) for _, targets in val)
    answers = sum(int(targets.shape[0]) for _, targets in val)
    return loss, loss * tokens / answers


def main():
    args = parse_args()
    from chatbot.data.pairs import load_pairs, split_by_question
    from chatbot.tokenizer.subword import Tokenizer

    pairs, _ = load_pairs(args.data)
    train_pairs, val_pairs = split_by_question(pairs, 0.1, 42)
    train_texts = [p.question for p in train_pairs] + [p.answer for p in train_pairs]
    all_texts = [p.question for p in pairs] + [p.answer for p in pairs]
    print(f"data: {args.data} ({len(pairs)} pairs: {len(train_pairs)} train / {len(val_pairs)} validation)")

    sentencepiece = Tokenizer.train(train_texts, args.vocab_size)
    wordpiece = WordPiece(train_texts, args.vocab_size)
    subword = TutorialSubword(train_texts)
    candidates = {
        "SentencePiece": (sentencepiece.tokenize, lambda ids: sentencepiece.decode(ids.to_list()),
                          sentencepiece.vocab_size),
        "WordPiece": (wordpiece.tokenize, wordpiece.detokenize_texts, wordpiece.vocab_size),
        "SubwordEncoder": (subword.tokenize, subword.detokenize_texts, subword.vocab_size),
    }
    rows = {}
    for name, (tokenize, detokenize, vocab_size) in candidates.items():
        exact, per_sentence, example = fidelity(all_texts, tokenize, detokenize)
        speed = sentences_per_second(all_texts, tokenize)
        print(f"\n{name}: vocabulary {vocab_size}, round trip exact {exact:.1%}, {per_sentence:.2f} tokens/sentence, "
              f"{speed:,.0f} sentences/s")
        if example:
            print(f"  e.g. {example[0]!r} -> {example[1]!r}")
        per_token, per_answer = validation_nats(tokenize, vocab_size, train_pairs, val_pairs, args)
        rows[name] = (vocab_size, exact, per_sentence, speed, per_token, per_answer)

    print(f"\n{'':14s} {'vocab':>6s} {'round trip':>11s} {'tokens/sent':>12s} {'sentences/s':>12s} "
          f"{'val loss/token':>15s} {'val nats/answer':>16s}   (after {args.epochs} epochs, same model)")
    for name, (vocab_size, exact, per_sentence, speed, per_token, per_answer) in rows.items():
        print(f"{name:14s} {vocab_size:6d} {exact:11.1%} {per_sentence:12.2f} {speed:12,.0f} {per_token:15.3f} "
              f"{per_answer:16.2f}")
    print("SubwordEncoder: the seed tutorial's tfds.deprecated.text.SubwordTextEncoder (2**13 target, spaced punctuation)")


if __name__ == "__main__":
    main()

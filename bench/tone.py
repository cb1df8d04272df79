"""Tone control: does a reply asked for in tone T read like the training answers of tone T?

For held-out questions (the validation split of the model's own training run, so questions it never
trained on), asks for each tone in turn and labels every reply by a nearest-answer vote: the label of
the training answer closest to it (TF-IDF over characters and bigrams, the retrieval index's measure, over
the answers instead of the questions). Prints, per asked tone, how often the vote agrees, beside the
rate a tone-blind model would get (the share of that label among training answers).

    python bench/tone.py [--model models/default] [--questions 300] [--decode candidates=0]

A reply that is a retrieved training answer (the default decoding weighs 8 of them against the
generated reply) votes for its own label: the rate then says how often the asked tone's answers win.
"""

import argparse
from collections import Counter
from pathlib import Path

from common import ROOT, parse_decode, training_file


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--questions", type=int, default=300, help="held-out questions to ask (default: 300)")
    parser.add_argument("--decode", default="", metavar="K=V,...",
                        help="decoding options, e.g. candidates=0 for the model's own replies (default: the default)")
    return parser.parse_args()


def main():
    args = parse_args()
    import tensorflow as tf

    from chatbot.config import TONES, ChatbotConfig
    from chatbot.data.pairs import QAPair, split_by_question
    from chatbot.data.datasets import load_sources
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.retrieval.retriever import Retriever

    bot = Chatbot.load(args.model)
    if not bot.has_tone:
        raise SystemExit(f"error: {args.model} learned no tones (its training data had no labels)")
    data = ChatbotConfig.read(Path(args.model) / "config.json").data
    pairs = load_sources([training_file(path) for path in data.paths], log=lambda *_: None)
    train, held_out = split_by_question(pairs, data.val_fraction, data.seed)
    if bot.config.context.retrieved:  # the saved index holds the held-out pairs too: retrieve as training did
        bot = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=Retriever(train))
    questions = [p.question for p in held_out[: args.questions]]
    labelled = [p for p in train if p.label is not None]
    # An index over the answers: "questions" are the training answers, each "answer" slot holds its label.
    by_answer = Retriever([QAPair(p.answer, str(p.label), None) for p in labelled])
    shares = Counter(p.label for p in labelled)
    print(f"model: {args.model}; {len(questions)} held-out questions; nearest-answer vote over "
          f"{len(labelled)} labelled training answers; decoding: {args.decode or 'default'}")
    print(f"{'asked tone':12s} {'agrees':>7s} {'tone-blind':>10s}")
    for tone, name in enumerate(TONES):
        replies = []
        for first in range(0, len(questions), 64):
            replies += bot.reply_batch(questions[first:first + 64], tone=name, **parse_decode(args.decode))
        votes = [int(label) for label in by_answer.nearest(tf.constant(replies), 1).numpy()[:, 0]]
        agree = sum(vote == tone for vote in votes) / len(votes)
        print(f"{name:12s} {agree:7.1%} {shares[tone] / len(labelled):10.1%}")


if __name__ == "__main__":
    main()

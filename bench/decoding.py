"""Decoding settings compared on one trained model: held-out reply quality of each, in one run.

Asks the questions of the model's own validation split (questions it never trained on, rebuilt from
its config's data paths, seed and fraction) with every setting in turn, the model retrieving from
its training pairs only. By default it leaves out the validation questions that `train` chose the
epoch and fitted the rerank weights on (`chatbot.training.best_epoch.validation_sample`), so no choice made in
training saw the questions scored; `--all-validation` keeps them. It prints chrF, character BLEU,
exact match, unique replies and distinct-1/2 per row (`chatbot.training.evaluate.reply_metrics`), beside the
nearest-question retrieval reference (the answer of the most similar training question).

    python bench/decoding.py [--model models/default] [--questions 600]
    python bench/decoding.py --decode strategy=beam,num_beams=8,agreement=4 --decode ""
"""

import argparse
import time
from pathlib import Path

from common import ROOT, parse_decode, training_file

# "" is the default decoding (greedy, then 8 retrieved answers weighed against the reply); candidates=0
# is the model's own reply alone.
ROWS = ["candidates=0", "no_repeat_ngram_size=3,candidates=0", "repetition_penalty=1.2,candidates=0",
        "strategy=sample,top_p=0.9,temperature=0.8,seed=0,candidates=0", "strategy=beam,num_beams=4,candidates=0",
        "strategy=beam,num_beams=8,agreement=4,candidates=0", "", "candidates=4", "candidates=16",
        "strategy=beam,num_beams=8,agreement=4"]


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--questions", type=int, default=600, help="held-out questions to ask (default: 600)")
    parser.add_argument("--all-validation", action="store_true",
                        help="also ask the validation questions training chose its epoch and rerank weights on")
    parser.add_argument("--decode", action="append", metavar="K=V,...",
                        help="a decoding setting to score (repeatable; \"\" is the default); default: a set of rows")
    return parser.parse_args()


def main():
    args = parse_args()
    from chatbot.config import ChatbotConfig
    from chatbot.data.pairs import split_by_question
    from chatbot.data.datasets import load_sources
    from chatbot.training.evaluate import reply_metrics
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.retrieval.retriever import Retriever
    from chatbot.training.best_epoch import unsampled

    bot = Chatbot.load(args.model)
    data = ChatbotConfig.read(Path(args.model) / "config.json").data
    pairs = load_sources([training_file(path) for path in data.paths], log=lambda *_: None)
    train, held_out = split_by_question(pairs, data.val_fraction, data.seed)
    held_out = (held_out if args.all_validation else unsampled(held_out))[: args.questions]
    questions, references = [p.question for p in held_out], [p.answer for p in held_out]
    retriever = Retriever(train)
    if bot.config.context.retrieved:  # the saved index holds the held-out pairs too: retrieve as training did
        bot = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=retriever)
    asked = "" if args.all_validation else ", none of them asked in its epoch selection or rerank fit"
    print(f"model: {args.model}; {len(questions)} held-out questions of its validation split "
          f"(seed {data.seed}, {data.val_fraction:.0%}{asked}); retrieval from {len(train)} training pairs")
    print(f"{'row':52s} {'chrF':>6s} {'BLEUc':>6s} {'exact':>6s} {'unique':>7s} {'dist1':>6s} {'dist2':>6s} {'ms/q':>6s}")

    def show(name, replies, seconds):
        m = reply_metrics(replies, references)
        print(f"{name[:52]:52s} {m['chrf']:6.2f} {m['bleu_char']:6.2f} {m['exact_match']:6.1%} "
              f"{m['unique_ratio']:7.1%} {m['distinct_1']:6.3f} {m['distinct_2']:6.3f} {seconds:6.1f}", flush=True)

    nearest = [a.decode("utf-8") for a in retriever.nearest(questions, 1).numpy()[:, 0]]
    show("nearest training question's answer (TF-IDF)", nearest, 0.0)
    for row in args.decode if args.decode is not None else ROWS:
        options = parse_decode(row)
        bot.reply_batch(questions[:64], **options)  # compile before timing
        start, replies = time.perf_counter(), []
        for first in range(0, len(questions), 64):
            replies += bot.reply_batch(questions[first:first + 64], **options)
        show(row or "default decoding", replies, (time.perf_counter() - start) * 1000 / len(questions))


if __name__ == "__main__":
    main()

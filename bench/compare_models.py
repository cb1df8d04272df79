"""Two or more trained models scored on the same held-out questions: those that none of them trained on.

Each model's training split is rebuilt from its config.json (data paths, validation share, seed); the
questions asked are the validation questions of the first model that no model trained on, leaving out those
any of them chose its epoch or rerank weights on. Each model retrieves from its own training pairs only, as in
training. Rows: each model's default decoding, its own reply (`candidates=0`), and its nearest-question
answer (the lookup), with chrF, exact match, unique replies and distinct-2 (`chatbot.training.evaluate.reply_metrics`).

    python bench/compare_models.py --model models/default --model models/new [--questions 600]
    python bench/compare_models.py ... --questions-from data/ChatbotData.csv   # the public questions only
"""

import argparse
from pathlib import Path

from common import training_file


def split_of(model: str):
    from chatbot.config import ChatbotConfig
    from chatbot.data.pairs import split_by_question
    from chatbot.data.datasets import load_sources
    from chatbot.training.sizing import fitted_to_data

    config = ChatbotConfig.read(Path(model) / "config.json")
    pairs = load_sources([training_file(path) for path in config.data.paths], log=lambda *_: None)
    data = fitted_to_data(config, len(pairs)).data
    return split_by_question(pairs, data.val_fraction, data.seed)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--questions", type=int, default=600)
    parser.add_argument("--questions-from", metavar="CSV", help="ask only held-out questions that occur in this CSV")
    args = parser.parse_args(argv)
    from chatbot.training.evaluate import reply_metrics
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.retrieval.retriever import Retriever
    from chatbot.training.best_epoch import validation_sample

    splits = {model: split_of(model) for model in args.model}
    trained = {p.question for train, _ in splits.values() for p in train}
    chosen_on = {p.question for _, val in splits.values() for p in validation_sample(val)}
    held_out = [p for p in splits[args.model[0]][1] if p.question not in trained | chosen_on]
    if args.questions_from:
        from chatbot.data.pairs import load_pairs

        wanted = {p.question for p in load_pairs(args.questions_from)[0]}
        held_out = [p for p in held_out if p.question in wanted]
    held_out = held_out[: args.questions]
    questions, references = [p.question for p in held_out], [p.answer for p in held_out]
    print(f"{len(held_out)} questions none of the models trained on or chose anything on\n")
    print("| model | reply | chrF | exact | unique | distinct-2 |\n|---|---|---|---|---|---|")
    for model in args.model:
        bot = Chatbot.load(model, compilation="graph")
        retriever = Retriever(splits[model][0])
        bot = Chatbot(bot.model, bot.tokenizer, bot.config, retriever=retriever, compilation="graph")
        rows = {"default": bot.reply_batch(questions), "own (candidates=0)": bot.reply_batch(questions, candidates=0),
                "lookup": [a.decode() for a in retriever.nearest(questions, 1).numpy()[:, 0]]}
        for name, replies in rows.items():
            m = reply_metrics(replies, references)
            print(f"| {Path(model).name} | {name} | {m['chrf']:.1f} | {m['exact_match']:.1%} | {m['unique_ratio']:.1%} "
                  f"| {m['distinct_2']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

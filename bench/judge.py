"""A blind judgment of replies to new messages (SSA, Adiwardana et al. 2020), in two steps.

`write` answers every message of a probe file (default `bench/probes.txt`: everyday messages in no training
file) with several systems, and writes one sheet in which each message's replies are shuffled and carry no
system name, plus a key that says which system wrote which row. A judge who sees only the sheet marks each
row `sensible` (fluent, on topic, fits what was said: 1 or 0) and, only if sensible, `specific` (would not fit
almost any message: 1 or 0). `score` reads the marked sheet with the key and prints, per system, the sensible
rate, the specific rate and SSA (their mean).

    python bench/judge.py write --model models/default --system default= --system own=candidates=0 \\
        --system beam=strategy=beam,num_beams=8,agreement=4,candidates=0 --lookup --out judge/
    python bench/judge.py score --sheet judge/sheet.csv --key judge/key.json

A system is `NAME=DECODING` (decoding as in bench/decoding.py: `name=value,...`; empty: the defaults), for the
model of the last `--model` before it; `--lookup` adds the answer of the nearest training question by the
model's index, `--bigram-lookup` by TF-IDF over character bigrams alone (bench/quality.py's lookup row).

Follow-ups: with `--probes bench/followups.csv` (columns first, reply, followup: the user's first message, the
bot's fixed reply, the user's follow-up) each system answers the follow-up with the first exchange as its
history, and the sheet shows the judge that exchange; `--blind-system NAME=DECODING` answers the same
follow-ups without it (the same model, history-blind):

    python bench/judge.py write --probes bench/followups.csv --model models/default --system context= \
        --blind-system blind= --out judge-followups/

`--after bench/followups.csv` asks each message of `--probes` in the middle of a conversation instead: after the
first exchange of one of those conversations (the 7i-th), as a user changing the topic would.
"""

import argparse
import csv
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

from common import ROOT, parse_decode

PROBES = ROOT / "bench" / "probes.txt"


def replies_of_systems(args) -> dict[str, list[str]]:
    from chatbot.data.pairs import QAPair
    from chatbot.decoding.chatbot import Chatbot

    messages, histories = probes_of(args.probes)
    if args.after:  # each message in the middle of a conversation: after the first exchange of one of these
        exchanges = probes_of(args.after)[1]
        histories = [exchanges[(7 * index) % len(exchanges)] for index in range(len(messages))]
    systems, bot, label = {"messages": messages, "histories": histories}, None, ""
    for kind, value in args.steps:
        if kind == "model":
            bot, label = Chatbot.load(value, compilation="graph"), Path(value).name
        elif kind == "retrieval":  # a retrieval setting for the systems of this model after it
            import dataclasses

            name, _, number = value.partition("=")
            number = number.lower() == "true" if number.lower() in ("true", "false") else float(number)
            config = dataclasses.replace(bot.config.retrieval, **{name: number})
            bot = Chatbot.load(bot.path, compilation="graph")
            bot.retriever.config, bot.config = config, dataclasses.replace(bot.config, retrieval=config)
            label = f"{Path(bot.path).name}[{value}]"
        elif kind == "lookup":
            systems[f"{label}:lookup"] = [a.decode() for a in bot.retriever.nearest(messages, 1).numpy()[:, 0]]
        elif kind == "bigram_lookup":
            from quality import nearest_question_answers

            asked = [QAPair(message, "") for message in messages]
            systems[f"{label}:bigram-lookup"] = nearest_question_answers(list(bot.retriever.pairs), asked)
        else:
            name, _, decoding = value.partition("=")
            seen = histories if kind == "system" and any(histories) else None
            systems[f"{label}:{name}"] = bot.reply_batch(messages, histories=seen, **parse_decode(decoding))
    return systems


def probes_of(path) -> tuple[list[str], list[list[dict]]]:
    """The messages of a probe file and the history before each: a text file's lines (no history), or a
    follow-up CSV's `followup` after its `first` and `reply`."""
    if str(path).endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))
        return [row["followup"] for row in rows], [[{"role": "user", "content": row["first"]},
                                                    {"role": "assistant", "content": row["reply"]}] for row in rows]
    messages = [line.strip() for line in open(path, encoding="utf-8") if line.strip()]
    return messages, [[] for _ in messages]


def shown(history: list[dict]) -> str:
    """The conversation before a message, as the judge reads it."""
    return " / ".join(f"{'나' if m['role'] == 'user' else '챗봇'}: {m['content']}" for m in history)


def write(args) -> None:
    systems = replies_of_systems(args)
    messages, histories = systems.pop("messages"), systems.pop("histories")
    rows, key = [], {}
    shuffle = random.Random(args.seed)
    for index, message in enumerate(messages):
        entries = [(name, replies[index]) for name, replies in systems.items()]
        shuffle.shuffle(entries)
        for name, reply in entries:
            row_id = f"{index + 1:03d}-{len(rows) % 97:02d}{shuffle.randrange(100):02d}"
            key[row_id] = name
            rows.append({"id": row_id, "before": shown(histories[index]), "message": message, "reply": reply,
                         "sensible": "", "specific": ""})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "sheet.csv", "w", newline="", encoding="utf-8") as file:
        columns = ["id", "message", "reply", "sensible", "specific"]
        writer = csv.DictWriter(file, columns[:1] + ["before"] * any(histories) + columns[1:], lineterminator="\n",
                                extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "key.json").write_text(json.dumps(key, ensure_ascii=False, indent=1), encoding="utf-8")
    print(f"{len(rows)} rows ({len(messages)} messages x {len(systems)} systems): {out / 'sheet.csv'}; "
          f"key: {out / 'key.json'} (keep it from the judge)")


def score(args) -> None:
    key = json.loads(Path(args.key).read_text(encoding="utf-8"))
    marks = defaultdict(lambda: [0, 0, 0])  # rows, sensible, specific
    with open(args.sheet, newline="", encoding="utf-8") as file:
        for row in csv.DictReader(file):
            sensible = row["sensible"].strip() == "1"
            counts = marks[key[row["id"]]]
            counts[0] += 1
            counts[1] += sensible
            counts[2] += sensible and row["specific"].strip() == "1"
    print("| system | replies | sensible | specific | SSA |\n|---|---|---|---|---|")
    for name, (rows, sensible, specific) in sorted(marks.items(), key=lambda item: -item[1][1]):
        print(f"| {name} | {rows} | {sensible / rows:.0%} | {specific / rows:.0%} | "
              f"{(sensible + specific) / (2 * rows):.0%} |")


class Step(argparse.Action):
    """Keeps --model, --system and the lookups in the order given."""

    def __call__(self, parser, namespace, value, option_string=None):
        namespace.steps.append((self.dest, value))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write", help="answer the probes with every system; write sheet and key")
    writing.set_defaults(steps=[], run=write)
    writing.add_argument("--model", action=Step, dest="model", required=True)
    writing.add_argument("--system", action=Step, dest="system", metavar="NAME=DECODING")
    writing.add_argument("--blind-system", action=Step, dest="blind_system", metavar="NAME=DECODING",
                         help="answer without the probes' history")
    writing.add_argument("--retrieval", action=Step, dest="retrieval", metavar="NAME=VALUE",
                         help="a RetrievalConfig field for the model's systems after it (e.g. conversation=0.5)")
    writing.add_argument("--lookup", action=Step, dest="lookup", nargs=0)
    writing.add_argument("--bigram-lookup", action=Step, dest="bigram_lookup", nargs=0)
    writing.add_argument("--probes", default=str(PROBES))
    writing.add_argument("--after", metavar="FOLLOWUPS.csv",
                         help="ask each probe after the first exchange of one of these conversations (the 7i-th)")
    writing.add_argument("--out", required=True)
    writing.add_argument("--seed", type=int, default=0)
    scoring = commands.add_parser("score", help="SSA per system from a marked sheet and its key")
    scoring.set_defaults(run=score)
    scoring.add_argument("--sheet", required=True)
    scoring.add_argument("--key", required=True)
    args = parser.parse_args(argv)
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Your own small CSV: the README's train command, no extra flags, on the two example FAQs in data/examples/.

For each example it trains as a user would (`python -m chatbot train --data FILE --out DIR`, in a subprocess,
timed), then asks every training question and every question of the paraphrase file, and prints how often the
reply is exactly the answer expected: with the default decoding and with the model's own reply alone
(`candidates=0`). A paraphrase counts only when the reply is its expected answer, so it scores content.

    python bench/small_csv.py [--examples shop_faq library_faq] [--keep DIR]
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

EXAMPLES = ROOT / "data" / "examples"


def accuracy(bot, pairs, **decoding) -> float:
    replies = bot.reply_batch([p.question for p in pairs], **decoding)
    return sum(reply == p.answer for reply, p in zip(replies, pairs)) / len(pairs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=["shop_faq", "library_faq"])
    parser.add_argument("--keep", metavar="DIR", help="write the trained models here instead of a temporary folder")
    args = parser.parse_args(argv)
    from chatbot.data import load_pairs
    from chatbot.generate import Chatbot

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="small-csv-"))
    root.mkdir(parents=True, exist_ok=True)
    print("| example | rows | train time | training questions (default) | paraphrases (default) | "
          "training questions (own reply) | paraphrases (own reply) | learned |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.examples:
        data, out = EXAMPLES / f"{name}.csv", root / name
        start = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "chatbot", "train", "--data", str(data), "--out", str(out)],
                             cwd=ROOT, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if run.returncode:
            print(f"| {name} | training failed: {run.stderr.strip().splitlines()[-1]} |")
            continue
        warning = [line for line in run.stdout.splitlines() if line.startswith("warning:")]
        bot = Chatbot.load(out, jit_compile=False)
        trained, _ = load_pairs(data)
        paraphrases, _ = load_pairs(EXAMPLES / f"{name}_paraphrases.csv")
        print(f"| {name} | {len(trained)} | {seconds:.0f} s | {accuracy(bot, trained):.0%} | "
              f"{accuracy(bot, paraphrases):.0%} | {accuracy(bot, trained, candidates=0):.0%} | "
              f"{accuracy(bot, paraphrases, candidates=0):.0%} | {'no: ' + warning[0] if warning else 'yes'} |",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

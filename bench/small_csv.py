"""Your own small CSV: the README's train command, no extra flags, on the two example FAQs in data/examples/.

For each example it trains as a user would (`python -m chatbot train --data FILE --out DIR`, in a subprocess,
timed: by default the new model builds on models/default), then asks every training question, every question of
the paraphrase file and every question of the out-of-scope file, and prints: how often the reply is exactly the
expected answer (a paraphrase counts only when the reply is its expected answer, so it scores content), how often
a paraphrase got the fallback reply ("I don't know") instead, how often an out-of-scope question got it, and what
the model does with the everyday messages of bench/probes.txt (a FAQ's model is no small-talk model: how many get
the fallback), and how many of GREETINGS (greetings, thanks and goodbyes worded unlike data/small_talk.csv) get an
answer of the small talk the model keeps from its base. `--from-scratch` adds the same rows for models trained from
the FAQ alone.

    python bench/small_csv.py [--examples shop_faq library_faq] [--from-scratch] [--keep DIR]
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT

EXAMPLES = ROOT / "data" / "examples"
PROBES = ROOT / "bench" / "probes.txt"
GREETINGS = ["안녕하세요~", "안녕!", "반갑습니다^^", "고마워요!", "감사합니다~~", "정말 감사해요", "땡큐요", "안녕히 계세요~",
             "수고하셨습니다", "좋은 하루 되세요"]


def share(replies, wanted) -> float:
    return sum(reply == want for reply, want in zip(replies, wanted)) / max(len(replies), 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", nargs="+", default=["shop_faq", "library_faq"])
    parser.add_argument("--from-scratch", action="store_true", help="also train each from scratch, for comparison")
    parser.add_argument("--keep", metavar="DIR", help="write the trained models here instead of a temporary folder")
    parser.add_argument("--base", default="models/default", help="the model each builds on (default: %(default)s)")
    parser.add_argument("--train-flag", action="append", default=[], metavar="FLAG",
                        help="one more flag for `train` (repeat; e.g. --train-flag=--peak-learning-rate=6e-4)")
    args = parser.parse_args(argv)
    import pandas as pd

    from chatbot.data.pairs import load_pairs
    from chatbot.decoding.chatbot import Chatbot

    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="small-csv-"))
    root.mkdir(parents=True, exist_ok=True)
    probes = [line.strip() for line in PROBES.read_text(encoding="utf-8").splitlines() if line.strip()]
    print("| example | start | rows | train time | training questions right | paraphrases right | "
          "paraphrases: fallback | out of scope: fallback | everyday probes: fallback | greetings answered |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.examples:
        for start in [args.base] + (["scratch"] if args.from_scratch else []):
            data, out = EXAMPLES / f"{name}.csv", root / f"{name}-{start.replace('/', '-')}"
            command = [sys.executable, "-m", "chatbot", "train", "--data", str(data), "--out", str(out),
                       *args.train_flag]
            if start != "scratch":
                command += ["--base", start]
            began = time.perf_counter()
            run = subprocess.run(command + (["--from-scratch"] if start == "scratch" else []), cwd=ROOT,
                                 capture_output=True, text=True)
            seconds = time.perf_counter() - began
            if run.returncode:
                print(f"| {name} | {start} | training failed: {run.stderr.strip().splitlines()[-1]} |")
                continue
            bot = Chatbot.load(out, compilation="graph")
            fallback = bot.retriever.config.fallback if bot.retriever is not None else None
            chatty = {p.answer for p in bot.retriever.small_talk} if bot.retriever is not None else set()
            trained, _ = load_pairs(data)
            paraphrases, _ = load_pairs(EXAMPLES / f"{name}_paraphrases.csv")
            outside = pd.read_csv(EXAMPLES / f"{name}_out_of_scope.csv", dtype=str).Q.tolist()
            para_replies = bot.reply_batch([p.question for p in paraphrases])
            print(f"| {name} | {start} | {len(trained)} | {seconds:.0f} s | "
                  f"{share(bot.reply_batch([p.question for p in trained]), [p.answer for p in trained]):.0%} | "
                  f"{share(para_replies, [p.answer for p in paraphrases]):.0%} | "
                  f"{share(para_replies, [fallback] * len(paraphrases)):.0%} | "
                  f"{share(bot.reply_batch(outside), [fallback] * len(outside)):.0%} | "
                  f"{share(bot.reply_batch(probes), [fallback] * len(probes)):.0%} | "
                  f"{sum(reply in chatty for reply in bot.reply_batch(GREETINGS)) / len(GREETINGS):.0%} |",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

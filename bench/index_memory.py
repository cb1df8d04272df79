"""Peak memory of what training does with the retrieval index, by the number of rows: building the index of a
model built on the default model (the retrain tab's and the README's "built on" setting), the leave-one-out
lookups of every training question, and the fallback's calibration. Each size runs in a fresh process, so its
peak resident memory is its own; the peak above the process's memory once the base model is loaded is printed.

    python bench/index_memory.py                      # 1,000 / 10,000 / 100,000 rows
    python bench/index_memory.py --rows 1000,20000 --text "질문 {i}번 어떻게 해요?"
    python bench/index_memory.py --rows 20000 --model ""    # no base model: the questions' characters alone

The rows are `--text` and `answer {i}` with {i} the row number: every question shares most of its characters
with every other, the worst case for an inverted index (the postings of shared characters hold every row).
Memory that grows with the square of the rows shows as a ratio near 100 between 10,000 and 100,000 rows;
linear growth, near 10 or below.
"""

import argparse
import json
import resource
import subprocess
import sys
import time

import common

MEASURE = r"""
import dataclasses, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from chatbot.startup import import_tensorflow_quietly
import_tensorflow_quietly(find_devices=False)
from chatbot.config import CHARACTERS_ONLY, ChatbotConfig
from chatbot.training.neighbours import tones_of, GOLD_POOL
from chatbot.data.pairs import QAPair
from chatbot.retrieval.retriever import Retriever, calibrated_threshold
from chatbot.training.sizing import fitted_to_data
from chatbot.training.train import built_on, load_base
rows, text = int(sys.argv[2]), sys.argv[3]
pairs = [QAPair(text.format(i=i), f"answer {i}", None) for i in range(rows)]
if sys.argv[4]:
    base = load_base(sys.argv[4])
    config = built_on(fitted_to_data(ChatbotConfig(), rows, built_on_base=True), base)
    encoder, tokenizer = base.encoder, base.tokenizer
else:  # the questions' characters alone (the inverted index whose postings grew with the square): no encoder
    config = fitted_to_data(ChatbotConfig(), rows)
    config = dataclasses.replace(config, retrieval=CHARACTERS_ONLY)
    encoder = tokenizer = None
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
retriever = Retriever(pairs, config.retrieval, encoder, tokenizer)
k = max(config.context.retrieved, GOLD_POOL) if config.context.questions else config.context.retrieved
retriever.leave_one_out(pairs, k, tones_of(pairs, config, 1.0))
calibrated_threshold(retriever, pairs, [], config.retrieval.fallback_share)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start, "loaded_mib": before / 1024,
                  "peak_mib": peak / 1024, "grown_mib": (peak - before) / 1024}))
"""


def measure(rows: int, text: str, model: str) -> dict:
    done = subprocess.run([sys.executable, "-c", MEASURE, str(common.ROOT), str(rows), text, model],
                          capture_output=True, text=True)
    if done.returncode:
        return {"rows": rows, "error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else
                f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1000,10000,100000", help="comma-separated row counts")
    parser.add_argument("--text", default="question {i} 질문", help="each question; {i} is the row number")
    parser.add_argument("--model", default=str(common.ROOT / "models" / "default"),
                        help='the base model ("": none, retrieval by the questions\' characters alone)')
    args = parser.parse_args()
    results = [measure(int(n), args.text, args.model) for n in args.rows.split(",")]
    print(f"{'rows':>8} {'seconds':>8} {'peak MiB':>9} {'grown MiB':>10} {'grown / previous':>17}")
    previous = None
    for r in results:
        if "error" in r:
            print(f"{r['rows']:>8}  failed: {r['error']}")
            previous = None
            continue
        ratio = f"{r['grown_mib'] / previous:.1f}" if previous else ""
        print(f"{r['rows']:>8} {r['seconds']:>8.1f} {r['peak_mib']:>9.0f} {r['grown_mib']:>10.0f} {ratio:>17}")
        previous = max(r["grown_mib"], 1.0)


if __name__ == "__main__":
    main()

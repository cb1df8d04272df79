"""What the benchmarks share: the project root on `sys.path`, the default data file, the
tokenized pairs the training benchmarks start from, and how a `--decode` setting is read.

Scripts run as `python bench/<name>.py`, so this directory is on `sys.path` and `import common` works.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BUNDLED_DATA = ROOT / "data" / "korean_chat.csv"
SHARED_DATA = ROOT.parent / "shared" / "data" / "ChatbotData.csv"
# The public ChatbotData set when it sits beside the checkout, else the bundled set.
DEFAULT_DATA = SHARED_DATA if SHARED_DATA.exists() else BUNDLED_DATA


def training_file(path: str) -> str:
    """A data path from a model's config.json, relative to the project: the file there, or, for the
    ChatbotData that `download` puts in data/, the same file beside the checkout (../shared/data)."""
    here, beside = ROOT / path, SHARED_DATA.parent / Path(path).name
    return str(beside if not here.is_file() and beside.is_file() else here)


def tokenized_pairs(path, vocab_size: int):
    """Load a Q&A CSV and learn a tokenizer on it: (pairs, tokenizer, question ids, answer ids)."""
    from chatbot.data.pairs import load_pairs
    from chatbot.tokenizer.subword import Tokenizer

    pairs, _ = load_pairs(path)
    questions, answers = [p.question for p in pairs], [p.answer for p in pairs]
    tokenizer = Tokenizer.train(questions + answers, vocab_size)
    return pairs, tokenizer, tokenizer.tokenize(questions), tokenizer.tokenize(answers)


def parse_decode(text: str) -> dict:
    """A decoding setting written as `name=value,...` ("strategy=beam,num_beams=4"; "" is greedy) as options."""
    options = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        options[name] = value if name == "strategy" else json.loads(value)
    return options


def stop(process: subprocess.Popen) -> None:
    """End a server started for a benchmark: ask it to stop, kill it if it has not within 30 s."""
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()

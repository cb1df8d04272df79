"""Whether a change to the reply path leaves every reply as it was: writes or checks a model's replies.

For a model directory, answers `bench/probes.txt` and the first held-out questions of `data/korean_chat.csv`
(the validation side of `chatbot.data.pairs.split_by_question(pairs, 0.1, 42)`) through every way a user gets a reply:
`reply` with the default settings, `reply_batch`, the last value of `stream`, a few other settings (beam 4, seeded
top-p sampling, candidates=8), follow-ups with a history (`bench/followups.csv`: its first message and reply, then
the follow-up), and the SavedModel (`export_saved_model`, loaded with `tf.saved_model.load`: `serving_default`
and `serve_with_history`) on a subset. `--write` stores them as JSON; `--check` compares and lists every
difference (exit 1 if any).

    python bench/same_replies.py --model models/default --write /tmp/replies.json
    python bench/same_replies.py --model models/default --check /tmp/replies.json
"""

import argparse
import csv
import json
import sys
import tempfile
import time

from common import ROOT

SETTINGS = {  # name -> decoding options, besides the defaults
    "beam4": {"strategy": "beam", "num_beams": 4},
    "top_p_seeded": {"strategy": "sample", "top_p": 0.9, "temperature": 0.8, "seed": 7},
    "candidates8": {"candidates": 8},
}


def questions(held_out: int) -> list[str]:
    from chatbot.data.pairs import load_pairs, split_by_question

    probes = [line.strip() for line in (ROOT / "bench" / "probes.txt").read_text(encoding="utf-8").splitlines()]
    pairs, _ = load_pairs(ROOT / "data" / "korean_chat.csv")
    _, validation = split_by_question(pairs, 0.1, 42)
    asked = list(dict.fromkeys(pair.question for pair in validation))[:held_out]
    return [p for p in probes if p] + asked


def followups() -> list[tuple[list[dict], str]]:
    with open(ROOT / "bench" / "followups.csv", encoding="utf-8", newline="") as file:
        rows = list(csv.DictReader(file))
    return [([{"role": "user", "content": row["first"]}, {"role": "assistant", "content": row["reply"]}],
             row["followup"]) for row in rows]


def replies(model: str, held_out: int, exported: int) -> dict:
    import tensorflow as tf

    from chatbot import Chatbot
    from chatbot.serving.saved_model import export_saved_model

    asked, follow = questions(held_out), followups()
    bot = Chatbot.load(model)
    out, started = {"questions": asked}, time.perf_counter()
    out["reply"] = [bot.reply(q) for q in asked]
    out["reply_batch"] = bot.reply_batch(asked)
    out["stream"] = [list(bot.stream(q))[-1] for q in asked]
    for name, options in SETTINGS.items():
        out[f"reply_batch_{name}"] = bot.reply_batch(asked, **options)
    out["followup_reply"] = [bot.reply(message, history=history) for history, message in follow]
    out["followup_batch"] = bot.reply_batch([m for _, m in follow], histories=[h for h, _ in follow])
    out["followup_stream"] = [list(bot.stream(message, history=history))[-1] for history, message in follow]
    print(f"python replies: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        export_saved_model(model, f"{tmp}/saved")
        loaded = tf.saved_model.load(f"{tmp}/saved")
        subset = asked[:exported]
        serve = loaded.signatures["serving_default"]
        out["saved_model"] = [r.decode("utf-8") for r in serve(questions=tf.constant(subset))["replies"].numpy()]
        with_history = loaded.signatures["serve_with_history"]
        history = tf.constant([[m["content"] for m in h] for h, _ in follow])
        result = with_history(questions=tf.constant([m for _, m in follow]), history=history,
                              tones=tf.fill([len(follow)], -1))
        out["saved_model_history"] = [r.decode("utf-8") for r in result["replies"].numpy()]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--held-out", type=int, default=500, help="held-out questions besides the probes")
    parser.add_argument("--exported", type=int, default=100, help="questions the SavedModel answers")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", metavar="FILE.json")
    what.add_argument("--check", metavar="FILE.json")
    args = parser.parse_args(argv)
    out = replies(args.model, args.held_out, args.exported)
    if args.write:
        with open(args.write, "w", encoding="utf-8") as file:
            json.dump(out, file, ensure_ascii=False, indent=1)
        print(f"wrote {sum(len(v) for k, v in out.items() if k != 'questions')} replies to {args.write}")
        return 0
    with open(args.check, encoding="utf-8") as file:
        expected = json.load(file)
    differences = 0
    for kind, values in expected.items():
        got = out.get(kind)
        if got is None or len(got) != len(values):
            print(f"{kind}: {len(values)} expected, {0 if got is None else len(got)} got")
            differences += 1
            continue
        for row, (want, have) in enumerate(zip(values, got)):
            if want != have:
                differences += 1
                print(f"{kind}[{row}] {out['questions'][row] if row < len(out['questions']) else ''!r}: "
                      f"{want!r} -> {have!r}")
    total = sum(len(v) for v in expected.values())
    print(f"{total - differences} of {total} identical" + ("" if differences else ": every reply unchanged"))
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())

"""Memory of a server after one client sweeps every decoding setting that is a tensor of the plan's function.

Loads a model (default: `models/default`, a plain graph as scripts use), replies once with each of the three plans
the sweep needs (greedy; sampling; beam search of 2), measures the process's resident memory, then sends twelve
values of each tensor setting (n-gram size and repetition penalty; temperature, top-k and top-p under sampling;
length penalty and agreement under beams: 84 replies), and measures again. Prints both, their difference and the
compiled functions kept (no new one should appear).

    python bench/settings_memory.py [--model models/default]
"""

import argparse
import gc

from common import ROOT

SWEEPS = {(): {"no_repeat_ngram_size": [0, *range(2, 13)], "repetition_penalty": [1 + i / 4 for i in range(12)]},
          (("strategy", "sample"),): {"temperature": [0.2 + i / 4 for i in range(12)], "top_k": list(range(12)),
                                      "top_p": [0.3 + i / 20 for i in range(12)]},
          (("strategy", "beam"), ("num_beams", 2)): {"length_penalty": [i / 4 for i in range(12)],
                                                      "agreement": [float(i) for i in range(12)]}}


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    args = parser.parse_args(argv)
    from chatbot.startup import import_tensorflow_quietly

    import_tensorflow_quietly(lean=True)
    from chatbot.decoding.chatbot import Chatbot

    bot = Chatbot.load(args.model, compilation="graph")
    for plan in SWEEPS:
        for _ in range(3):  # the first replies settle the allocator as well as tracing the plan
            bot.reply("배고파", seed=1, **dict(plan))
    gc.collect()
    start, kept = resident_mib(), list(bot.compiled_plans)
    replies = 0
    for plan, settings in SWEEPS.items():
        for name, values in settings.items():
            for value in values:
                bot.reply("배고파", seed=1, **dict(plan), **{name: value})
                replies += 1
    gc.collect()
    end = resident_mib()
    print(f"model: {args.model}")
    print(f"resident memory after the three plans' first replies: {start:,.0f} MiB ({len(kept)} compiled functions)")
    print(f"after {replies} replies sweeping 12 values of each tensor setting: {end:,.0f} MiB "
          f"({len(bot.compiled_plans)} compiled functions, {'the same' if bot.compiled_plans == kept else 'NEW'})")
    print(f"difference: {end - start:+,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A bar chart of the ratios to the seed tutorial's recipe that two benchmark runs printed.

Reads the saved output of `bench/decode_latency.py` (its "speedup of ... over the tutorial's loop" lines)
and of `bench/train_throughput.py` (each row's pairs/s ratio), and draws both as horizontal bars on a
log scale, with the 1x of the tutorial marked:

    python bench/decode_latency.py > decode.txt
    python bench/train_throughput.py > train.txt
    python bench/ratios_chart.py --decode decode.txt --train train.txt --out bench/ratios.png
"""

import argparse
import re
import sys
from pathlib import Path

DECODE_LINE = re.compile(r"^speedup of (.+) over the tutorial's loop \(p50\): ([\d.]+)x")
TRAIN_LINE = re.compile(r"^(.+?)\s+\d+ non-pad target tokens/s .*\|\s*[\d.]+ pairs/s\s+([\d.]+)x the tutorial")


def ratios(path: Path, pattern: re.Pattern) -> list[tuple[str, float]]:
    found = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        match = pattern.match(line.strip())
        if match:
            found.append((match.group(1).strip(), float(match.group(2))))
    return found


def fail(message: str):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decode", type=Path, required=True, help="saved output of bench/decode_latency.py")
    parser.add_argument("--train", type=Path, required=True, help="saved output of bench/train_throughput.py")
    parser.add_argument("--out", type=Path, default=Path("bench/ratios.png"), help="PNG to write (default: %(default)s)")
    args = parser.parse_args()
    for path in (args.decode, args.train):
        if not path.is_file():
            fail(f"{path}: no such file")
    decode = ratios(args.decode, DECODE_LINE)
    train = [(name, ratio) for name, ratio in ratios(args.train, TRAIN_LINE) if not name.startswith("tutorial")]
    if not decode or not train:
        fail(f"no ratios found in {args.decode if not decode else args.train}: is it that benchmark's output?")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5.5), height_ratios=[len(decode), len(train)])
    for axis, rows, title in ((top, decode, "Reply latency: times faster than the tutorial's greedy loop (p50)"),
                              (bottom, train, "Training: pairs per second, times the tutorial's recipe")):
        names, values = [name for name, _ in rows][::-1], [value for _, value in rows][::-1]
        bars = axis.barh(names, values, color="#4c72b0")
        axis.bar_label(bars, labels=[f"{v:.1f}x" for v in values], padding=3, fontsize=8)
        axis.set_xscale("log")
        axis.axvline(1, color="gray", linestyle="--", linewidth=1)
        axis.set_xlim(0.8, max(values) * 3)
        axis.set_title(title, fontsize=10)
        axis.tick_params(labelsize=8)
    figure.tight_layout()
    temporary = args.out.with_name(f".{args.out.name}.tmp")
    figure.savefig(temporary, dpi=110, format="png")
    temporary.replace(args.out)  # atomic: never a half-written chart
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

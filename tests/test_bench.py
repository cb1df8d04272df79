"""bench/ratios_chart.py: the chart of the ratios that the decoding and training benchmarks print."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "ratios_chart.py"

DECODE_OUTPUT = """model: models/default; 100 questions from data/korean_chat.csv
                            p50 ms    p95 ms   (per reply)
cached greedy                 9.29     12.43
speedup of cached greedy over the tutorial's loop (p50): 213.2x
speedup of cached beam 4 over the tutorial's loop (p50): 125.9x
beam 4 cost relative to greedy (p50): 1.69x
"""
TRAIN_OUTPUT = """data: ChatbotData.csv (11248 pairs), vocabulary 8000 (the package's own: 4000), batch 64
tutorial: padded              724 non-pad target tokens/s  1.00x |  91.4 pairs/s  1.00x the tutorial  (60825 tokens, 7680 pairs in 84.0 s)
package, question only       3995 non-pad target tokens/s    -   | 485.1 pairs/s  5.31x the tutorial  (63252 tokens, 7680 pairs in 15.8 s)
"""


def chart(tmp_path, decode, train):
    (tmp_path / "decode.txt").write_text(decode, encoding="utf-8")
    (tmp_path / "train.txt").write_text(train, encoding="utf-8")
    return subprocess.run([sys.executable, str(SCRIPT), "--decode", str(tmp_path / "decode.txt"), "--train",
                           str(tmp_path / "train.txt"), "--out", str(tmp_path / "ratios.png")],
                          capture_output=True, text=True, timeout=120)


def test_the_printed_ratios_are_read_and_drawn(tmp_path):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from ratios_chart import DECODE_LINE, TRAIN_LINE, ratios
    finally:
        sys.path.remove(str(SCRIPT.parent))
    (tmp_path / "d.txt").write_text(DECODE_OUTPUT, encoding="utf-8")
    (tmp_path / "t.txt").write_text(TRAIN_OUTPUT, encoding="utf-8")
    assert ratios(tmp_path / "d.txt", DECODE_LINE) == [("cached greedy", 213.2), ("cached beam 4", 125.9)]
    assert ratios(tmp_path / "t.txt", TRAIN_LINE) == [("tutorial: padded", 1.0), ("package, question only", 5.31)]
    result = chart(tmp_path, DECODE_OUTPUT, TRAIN_OUTPUT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_output_of_the_wrong_benchmark_is_one_error_line(tmp_path):
    result = chart(tmp_path, TRAIN_OUTPUT, TRAIN_OUTPUT)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: no ratios found in {tmp_path / 'decode.txt'}: is it that benchmark's output?"]
    assert not (tmp_path / "ratios.png").exists()

"""bench/ratios_chart.py: the chart of the ratios that the decoding and training benchmarks print; and
bench/cold_start.py, which times the app's and the command line's first replies (what it prints, not how fast)."""

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "ratios_chart.py"
COLD_START = ROOT / "bench" / "cold_start.py"

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


def bench_module(name: str):
    """A script of bench/ imported as a module; bench/ is on the path meanwhile, as the scripts import each other."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(SCRIPT.parent))


def chart(tmp_path, decode, train):
    (tmp_path / "decode.txt").write_text(decode, encoding="utf-8")
    (tmp_path / "train.txt").write_text(train, encoding="utf-8")
    return subprocess.run([sys.executable, str(SCRIPT), "--decode", str(tmp_path / "decode.txt"), "--train",
                           str(tmp_path / "train.txt"), "--out", str(tmp_path / "ratios.png")],
                          capture_output=True, text=True, timeout=120)


def test_the_printed_ratios_are_read_and_drawn(tmp_path):
    script = bench_module("ratios_chart")
    (tmp_path / "d.txt").write_text(DECODE_OUTPUT, encoding="utf-8")
    (tmp_path / "t.txt").write_text(TRAIN_OUTPUT, encoding="utf-8")
    assert script.ratios(tmp_path / "d.txt", script.DECODE_LINE) == [("cached greedy", 213.2), ("cached beam 4", 125.9)]
    assert script.ratios(tmp_path / "t.txt", script.TRAIN_LINE) == [("tutorial: padded", 1.0),
                                                                     ("package, question only", 5.31)]
    result = chart(tmp_path, DECODE_OUTPUT, TRAIN_OUTPUT)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ratios.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_output_of_the_wrong_benchmark_is_one_error_line(tmp_path):
    result = chart(tmp_path, TRAIN_OUTPUT, TRAIN_OUTPUT)
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        f"error: no ratios found in {tmp_path / 'decode.txt'}: is it that benchmark's output?"]
    assert not (tmp_path / "ratios.png").exists()


# The bench started with SIGINT ignored, as a script's background job (and some CI runners) start it: its Ctrl-C
# must still reach the app, which would otherwise inherit that and ignore it.
SIGINT_IGNORED = ("import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                  "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])")


def cold_start(*args):
    env = {name: value for name, value in os.environ.items() if name != "TF_CPP_MIN_LOG_LEVEL"}  # as a user starts
    return subprocess.run([sys.executable, "-c", SIGINT_IGNORED, str(COLD_START), *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env=env)


def test_the_cold_start_bench_asks_questions_of_five_lengths_and_refuses_bad_arguments(tmp_path):
    QUESTIONS = bench_module("cold_start").QUESTIONS
    assert len(QUESTIONS) == 5 and len({len(q) for q in QUESTIONS}) == 5 and max(map(len, QUESTIONS)) <= 200
    result = cold_start("--help")
    assert result.returncode == 0 and all(flag in result.stdout for flag in ("--model", "--runs", "--skip-app"))
    for args, reason in ((["--runs", "0"], "--runs must be at least 1"), (["--model", tmp_path], "no model directory")):
        result = cold_start(*args)
        assert result.returncode == 2 and not result.stdout, result.stderr
        assert [line for line in result.stderr.splitlines() if line] == [result.stderr.strip()], result.stderr
        assert result.stderr.startswith("error: ") and reason in result.stderr


def test_a_hung_ctrl_c_is_reported_with_the_apps_sigint_state():
    """When Ctrl-C does not end the app, the bench says whether SIGINT was ignored, caught, pending or blocked."""
    sigint_state = bench_module("cold_start").sigint_state
    states = {}
    for handler in ("SIG_IGN", "default_int_handler"):
        sleeper = subprocess.Popen([sys.executable, "-c", f"import signal, time; signal.signal(signal.SIGINT, "
                                    f"signal.{handler}); print(flush=True); time.sleep(60)"], stdout=subprocess.PIPE)
        try:
            sleeper.stdout.readline()
            states[handler] = sigint_state(sleeper.pid)
        finally:
            sleeper.kill()
            sleeper.wait()
    assert re.fullmatch(r"SIGINT ignored True, caught False, pending False, blocked in 0 of \d+ threads",
                        states["SIG_IGN"]), states
    assert re.fullmatch(r"SIGINT ignored False, caught True, pending False, blocked in 0 of \d+ threads",
                        states["default_int_handler"]), states
    assert sigint_state(sleeper.pid).startswith("its SIGINT state is unknown")


@pytest.mark.slow  # the app and the command line, each in a subprocess, on the tiny model
def test_the_cold_start_bench_times_the_page_five_replies_and_chat_q_and_ctrl_c_ends_the_app_cleanly(tiny_model_dir):
    result = cold_start("--model", tiny_model_dir, "--runs", 1)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr[-3000:]
    assert re.search(r"page served [\d.]+ s after start", out), out
    assert len(re.findall(r"reply \d \( *\d+ characters\): answered in [\d.]+ s, [\d.]+ s after the page", out)) == 5
    assert re.search(r"chat -q '[^']+': [\d.]+ s end to end -> \S", out), out
    assert "and on stderr" not in out  # the command line's start-up is quiet
    # Ctrl-C right after five replies: the XLA warm-up is still compiling, and the app must not abort
    assert "the background XLA warm-up was still running by then" in out, out
    assert "  Ctrl-C: the app ended cleanly (status 0)\n" in out, out


# An app.py that ends as Gradio's launch does on a port another socket holds, and else serves HTTP.
PORT_TAKING_APP = """
import http.server, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
try:
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
except OSError:
    sys.exit(f"OSError: Cannot find empty port in range: {port}-{port}.")
server.serve_forever()
"""


def test_the_load_test_starts_the_app_on_another_port_when_its_port_was_taken(tmp_path, monkeypatch):
    """A port chosen unused can be taken before the app listens on it: the app then ends, and the next port is
    tried. Here the first port handed out is one this test holds, and app.py is a stand-in that fails on it
    with Gradio's message (the real app takes seconds to load a model before it gets there)."""
    import importlib.util
    import socket
    import urllib.request

    load_app, common = bench_module("load_app"), bench_module("common")
    gradio = Path(importlib.util.find_spec("gradio").submodule_search_locations[0])
    gradio_server = (gradio / "http_server.py").read_text(encoding="utf-8")
    assert "Cannot find empty port" in gradio_server  # what port_was_taken looks for (without importing Gradio)
    (tmp_path / "app.py").write_text(PORT_TAKING_APP, encoding="utf-8")
    monkeypatch.setattr(load_app, "ROOT", tmp_path)
    unused = load_app.free_port
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: a bind fails on it, a connection is refused at once
        ports = iter([taken.getsockname()[1]])
        monkeypatch.setattr(load_app, "free_port", lambda: next(ports, None) or unused())
        with open(tmp_path / "app.log", "wb") as log:
            process, url = load_app.start_app("a model", log)
        try:
            assert f":{taken.getsockname()[1]}/" not in url
            with urllib.request.urlopen(url, timeout=30) as page:
                assert page.status == 200
        finally:
            common.stop(process)
    assert b"Cannot find empty port" in (tmp_path / "app.log").read_bytes()  # the first try met the taken port


@pytest.mark.slow  # a TensorFlow subprocess: leave-one-out lookups of 20,000 training questions
def test_indexing_20000_templated_rows_stays_within_a_bounded_memory(capsys):
    """Every question `question {i} 질문`: the n-grams they all share once made each lookup expand every row's
    postings, so leave-one-out memory grew with the square of the rows (10,000 rows: 3.5 GB). It must now grow
    with the rows; the peak is printed for the record."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "index_memory.py"), "--rows", "20000", "--model", ""],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows, seconds, peak, grown = done.stdout.strip().splitlines()[-1].split()[:4]
    with capsys.disabled():
        print(f"\n20,000 rows: peak {peak} MiB, grown {grown} MiB while indexing and leaving one out ({seconds} s)")
    assert rows == "20000" and float(grown) < 1024

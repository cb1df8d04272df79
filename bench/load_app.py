"""Load test of the web app: concurrent clients ask questions through `/chat`, invalid requests mixed in.

Starts `app.py --model MODEL` on 127.0.0.1 (a free port) in a subprocess and waits until it serves,
asks one warm-up question (the first reply compiles the decoder) and sends one uncounted warm-up
burst (the app compiles its decoding loop once per batch shape), then runs `--clients` threads,
each with its own gradio_client, sending `--questions` requests one after another. Requests are
numbered round-robin over the clients, and every `--bad-every`-th one is invalid: a beam width of
99, a seed past int32, a top_k of 2^40, no_repeat_ngram_size 1 (refused with a message) or a
5,000-character question (the app clips it and answers). The valid ones are questions of the
bundled data with the default settings. Prints sent / answered / refused / failed and the
p50/p95/p99 latency of valid requests, then checks that the app still answers.

Exit status 1 if any valid request went unanswered, an invalid one got neither its refusal nor a
reply, or the app stopped answering; 2 if the app did not start.

    python bench/load_app.py [--clients 50] [--questions 10] [--bad-every 5] [--model models/default]
"""

import argparse
import csv
import itertools
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from common import BUNDLED_DATA, ROOT

# (what it is, the request's changes to a valid one, what the app must do with it)
BAD_REQUESTS = [
    ("num_beams=99", {"num_beams": 99, "strategy": "beam"}, "refused"),
    ("seed=2**31", {"seed": 2**31, "strategy": "sample"}, "refused"),
    ("top_k=2**40", {"top_k": 2**40, "strategy": "sample"}, "refused"),
    ("no_repeat_ngram_size=1", {"no_repeat_ngram_size": 1}, "refused"),
    ("5,000-character question", {"message": "배고파" * 1667}, "answered"),
]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients (default: %(default)s)")
    parser.add_argument("--questions", type=int, default=10, help="requests per client (default: %(default)s)")
    parser.add_argument("--bad-every", type=int, default=5, metavar="N",
                        help="every Nth request is invalid; 0: none (default: %(default)s)")
    parser.add_argument("--model", default=str(ROOT / "models" / "default"), help="model directory the app serves")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one request may take (default: %(default)s)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="start the app with --no-warm-up (it compiles each batch shape when first asked)")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.questions < 1 or args.bad_every < 0:
        parser.error("--clients and --questions must be at least 1, --bad-every at least 0")
    return args


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_app(model: str, log, *options: str) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free local port; returns (process, url) once it answers HTTP."""
    port = free_port()
    process = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--model", model, "--host", "127.0.0.1",
                                "--port", str(port), *options], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 600
    while time.time() < deadline and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return process, url
        except OSError:
            time.sleep(0.5)
    process.kill()
    process.wait()
    raise RuntimeError("the app did not start")


def questions_from(path: Path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as file:
        return [row[0] for row in itertools.islice(csv.reader(file), 1, None) if row and row[0].strip()]


class Outcome:
    """What happened to one request: kind ("valid" or a BAD_REQUESTS name), result, seconds, detail."""

    def __init__(self, kind, expected, result, seconds, detail=""):
        self.kind, self.expected, self.result, self.seconds, self.detail = kind, expected, result, seconds, detail

    @property
    def failed(self) -> bool:
        return self.result != self.expected


def ask(client, request: dict, timeout: float) -> tuple[str, float, str]:
    """("answered" | "refused" | "no reply", seconds, detail) of one `/chat` request."""
    from gradio_client.exceptions import AppError

    request = dict(request)
    start = time.perf_counter()
    try:
        reply = client.submit(request.pop("message"), **request, api_name="/chat").result(timeout=timeout)
    except AppError as error:  # the app's own message, shown to the user
        return "refused", time.perf_counter() - start, " ".join(str(error).split())[:120]
    except Exception as error:  # a timeout, a dropped connection, a server crash
        return "no reply", time.perf_counter() - start, f"{type(error).__name__}: {error}"[:200]
    seconds = time.perf_counter() - start
    if isinstance(reply, str) and reply.strip():
        return "answered", seconds, ""
    return "no reply", seconds, f"empty reply {reply!r}"


def run_burst(url: str, clients: int, per_client: int, bad_every: int, timeout: float) -> list[Outcome]:
    from gradio_client import Client

    questions = questions_from(BUNDLED_DATA)
    outcomes, lock = [], threading.Lock()

    def client_thread(c: int):
        try:
            client = Client(url, verbose=False)
        except Exception as error:
            with lock:
                outcomes.extend(Outcome("valid", "answered", "no reply", 0.0, f"connect: {error}")
                                for _ in range(per_client))
            return
        for q in range(per_client):
            number = q * clients + c + 1  # round-robin: the bad ones are spread over time and clients
            request = {"message": questions[number % len(questions)]}
            kind, expected = "valid", "answered"
            if bad_every and number % bad_every == 0:
                kind, changes, expected = BAD_REQUESTS[(number // bad_every) % len(BAD_REQUESTS)]
                request.update(changes)
            result, seconds, detail = ask(client, request, timeout)
            with lock:
                outcomes.append(Outcome(kind, expected, result, seconds, detail))

    threads = [threading.Thread(target=client_thread, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def report(outcomes: list[Outcome], clients: int, per_client: int) -> list[str]:
    valid = [o for o in outcomes if o.kind == "valid"]
    bad = [o for o in outcomes if o.kind != "valid"]
    answered = [o for o in outcomes if o.result == "answered"]
    refused = [o for o in outcomes if o.result == "refused"]
    failed = [o for o in outcomes if o.failed]
    lines = [
        f"sent {len(outcomes)} ({len(valid)} valid, {len(bad)} invalid) from {clients} clients x {per_client} requests",
        f"answered {len(answered)} ({sum(o.kind == 'valid' for o in answered)} of {len(valid)} valid, "
        f"{sum(o.kind != 'valid' for o in answered)} over-long questions clipped and answered)",
        f"refused {len(refused)} ({sum(o.kind != 'valid' for o in refused)} invalid, "
        f"{sum(o.kind == 'valid' for o in refused)} valid)",
        f"failed {len(failed)} ({sum(o.kind == 'valid' for o in failed)} valid unanswered, "
        f"{sum(o.kind != 'valid' for o in failed)} invalid without refusal or reply)",
    ]
    seconds = [o.seconds for o in valid if o.result == "answered"]
    if seconds:
        p50, p95, p99 = np.percentile(seconds, [50, 95, 99])
        lines.append(f"latency of answered valid requests: p50 {p50:.2f} s, p95 {p95:.2f} s, p99 {p99:.2f} s, "
                     f"max {max(seconds):.2f} s")
    lines += [f"  failed: {o.kind}: {o.result} ({o.detail})" for o in failed[:5]]
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    from gradio_client import Client

    with tempfile.TemporaryFile() as app_log:
        try:
            process, url = start_app(args.model, app_log, *(["--no-warm-up"] if args.no_warm_up else []))
        except RuntimeError as error:
            app_log.seek(0)
            print(f"error: {error}:\n{app_log.read().decode(errors='replace')[-3000:]}", file=sys.stderr)
            return 2
        try:
            print(f"app: {url} serving {args.model}", flush=True)
            warm = ask(Client(url, verbose=False), {"message": "안녕하세요"}, args.timeout)
            print(f"warm-up: {warm[0]} in {warm[1]:.2f} s", flush=True)
            start = time.perf_counter()  # a first burst, not counted, meets every batch shape the app compiles
            run_burst(url, args.clients, 2, 0, args.timeout)
            print(f"warm-up burst ({args.clients} clients x 2 valid requests) took {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
            outcomes = run_burst(url, args.clients, args.questions, args.bad_every, args.timeout)
            print(f"burst took {time.perf_counter() - start:.1f} s")
            for line in report(outcomes, args.clients, args.questions):
                print(line, flush=True)
            after = ask(Client(url, verbose=False), {"message": "배고파"}, args.timeout)
            print(f"after the burst: {after[0]} in {after[1]:.2f} s {after[2]}".rstrip(), flush=True)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    return 1 if any(o.failed for o in outcomes) or after[0] != "answered" else 0


if __name__ == "__main__":
    sys.exit(main())

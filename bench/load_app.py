"""Load test of the web app: concurrent clients ask questions through `/chat`, invalid requests mixed in.

Starts `app.py --model MODEL` on 127.0.0.1 (a free port) in a subprocess, waits until it serves and
until its background warm-up has compiled every batch shape (its log says so), asks one warm-up
question and sends one uncounted warm-up burst, then, for each `--clients` count, runs that many
threads, each sending `--questions` requests one after another. Requests are numbered round-robin
over the clients, and every `--bad-every`-th one is invalid: a beam width of 99, a seed past int32,
a top_k of 2^40, no_repeat_ngram_size 1, a question that is a lone surrogate (refused with a message), a
5,000-character question (the app clips it and answers) or a valid but new pair of no_repeat_ngram_size and
candidates (answered; compiled functions are bounded, so the server's memory stays flat: the bench prints its
memory after the warm-up and its peak during the bursts). The valid ones are questions of the bundled data with the default
settings. Prints sent / answered / refused / failed and the p50/p95/p99 latency of valid requests
per clients count, and the CPU seconds the server and the load generator used; then checks that the
app still answers.

Clients post to `/gradio_api/run/chat` over HTTP (`--client http`, the default: one request per
reply, a few ms of the load generator's CPU), or use gradio_client (`--client gradio`, as a Python
user would: it costs the load generator ~0.1 s of CPU per request, on the server's cores here).

Exit status 1 if any valid request went unanswered, an invalid one got neither its refusal nor a
reply, or the app stopped answering; 2 if the app did not start.

    python bench/load_app.py [--clients 1 10 50] [--questions 10] [--bad-every 5] [--model models/default]
"""

import argparse
import csv
import json
import itertools
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import numpy as np

from common import BUNDLED_DATA, ROOT, stop

# (what it is, the request's changes to a valid one, what the app must do with it)
BAD_REQUESTS = [
    ("num_beams=99", {"num_beams": 99, "strategy": "beam"}, "refused"),
    ("seed=2**31", {"seed": 2**31, "strategy": "sample"}, "refused"),
    ("top_k=2**40", {"top_k": 2**40, "strategy": "sample"}, "refused"),
    ("no_repeat_ngram_size=1", {"no_repeat_ngram_size": 1}, "refused"),
    ("5,000-character question", {"message": "배고파" * 1667}, "answered"),
    ("lone surrogate", {"message": "\ud800"}, "refused"),  # not valid text: refused alone, never its batch
    ("option sweep", "sweep", "answered"),  # valid, each one new: n-gram sizes 2-21 and candidate counts 0-16
]


def changes_for(changes, number: int) -> dict:
    """A bad request's changes; "sweep" is a valid no_repeat_ngram_size and candidates pair new to the app."""
    if changes == "sweep":
        return {"no_repeat_ngram_size": 2 + number % 20, "candidates": number % 17}
    return changes
WARM_LINE = b"warm-up done"  # what the app logs once every batch shape is compiled


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[50], metavar="N",
                        help="concurrent clients, one burst per count (default: %(default)s)")
    parser.add_argument("--questions", type=int, default=10, help="requests per client (default: %(default)s)")
    parser.add_argument("--bad-every", type=int, default=5, metavar="N",
                        help="every Nth request is invalid; 0: none (default: %(default)s)")
    parser.add_argument("--model", default=str(ROOT / "models" / "default"), help="model directory the app serves")
    parser.add_argument("--client", choices=("http", "gradio"), default="http",
                        help="plain HTTP posts or gradio_client (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one request may take (default: %(default)s)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="start the app with --no-warm-up (it compiles each batch shape when first asked)")
    parser.add_argument("--no-xla", action="store_true",
                        help="start the app with --no-xla (plain graph decoding: no compiling, slower replies)")
    args = parser.parse_args(argv)
    if min(args.clients) < 1 or args.questions < 1 or args.bad_every < 0:
        parser.error("--clients and --questions must be at least 1, --bad-every at least 0")
    return args


def free_port() -> int:
    """A port nothing listens on now; another process may take it before the app does (see `port_was_taken`)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


PORT_ATTEMPTS = 3


def port_was_taken(process: subprocess.Popen, log_path: str) -> bool:
    """Whether the app ended because its port was taken between `free_port` and its start (Gradio's message)."""
    return process.poll() is not None and b"Cannot find empty port" in Path(log_path).read_bytes()


def start_app(model: str, log, *options: str) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free local port (another one if that was taken meanwhile); returns (process, url)
    once it answers HTTP."""
    for _ in range(PORT_ATTEMPTS):
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
        if not port_was_taken(process, log.name):
            break
    process.kill()
    process.wait()
    raise RuntimeError("the app did not start")


def wait_for_warm_up(process: subprocess.Popen, log_path: str, limit: float = 1800) -> float:
    """Seconds waited until the app's log says its warm-up is done."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit and process.poll() is None:
        if WARM_LINE in Path(log_path).read_bytes():
            break
        time.sleep(1)
    return time.perf_counter() - start


def cpu_seconds(pid: int | None = None) -> float:
    """User + system CPU seconds of this process, or of process `pid` (Linux)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def resident_mib(pid: int) -> float:
    with open(f"/proc/{pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def sample_memory(pid: int, peak: list, stop: threading.Event) -> None:
    """Append the server's resident memory every half second until `stop` (its peak is what counts)."""
    while not stop.wait(0.5):
        try:
            peak.append(resident_mib(pid))
        except OSError:
            return


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


class HttpClient:
    """`/chat` by a plain POST to `/gradio_api/run/chat`, every parameter given (defaults from `/gradio_api/info`),
    with a session hash of its own as gradio_client sends: Gradio keeps one session state per hash, and
    builds one for a request without a hash, from the configuration of every block of the UI (~30 ms
    of the server's CPU at this app's size, more than a batched reply)."""

    def __init__(self, url: str, timeout: float):
        import httpx

        self.url, self.session_hash = url, uuid.uuid4().hex
        self.session = httpx.Client(timeout=timeout, verify=needs_certificates(url))
        parameters = self.session.get(url + "gradio_api/info").json()["named_endpoints"]["/chat"]["parameters"]
        self.defaults = {p["parameter_name"]: p.get("parameter_default") for p in parameters}

    def ask(self, request: dict) -> tuple[str, str]:
        body = {"data": [request.get(name, value) for name, value in self.defaults.items()],
                "session_hash": self.session_hash}
        response = self.session.post(self.url + "gradio_api/run/chat", content=json.dumps(body),  # "\ud800" escaped
                                     headers={"content-type": "application/json"})
        body = response.json()
        if response.status_code == 200 and isinstance(body.get("data"), list) and body["data"]:
            reply = body["data"][0]
            return ("answered", "") if isinstance(reply, str) and reply.strip() else ("no reply", f"empty {reply!r}")
        if body.get("error"):  # the app's own message, shown to the user
            return "refused", " ".join(str(body["error"]).split())[:120]
        return "no reply", f"HTTP {response.status_code}: {str(body)[:150]}"


class GradioClient:
    """`/chat` through gradio_client, as a Python user calls it."""

    def __init__(self, url: str, timeout: float):
        from gradio_client import Client

        self.client, self.timeout = Client(url, verbose=False, ssl_verify=needs_certificates(url)), timeout

    def ask(self, request: dict) -> tuple[str, str]:
        from gradio_client.exceptions import AppError

        request = dict(request)
        try:
            reply = self.client.submit(request.pop("message"), **request, api_name="/chat").result(timeout=self.timeout)
        except AppError as error:  # the app's own message, shown to the user
            return "refused", " ".join(str(error).split())[:120]
        return ("answered", "") if isinstance(reply, str) and reply.strip() else ("no reply", f"empty reply {reply!r}")


CLIENTS = {"http": HttpClient, "gradio": GradioClient}


def needs_certificates(url: str) -> bool:
    """Whether a client of `url` verifies certificates: only over https. An HTTP client that verifies loads
    the CA bundle, about 35 ms of CPU per client (gradio_client: per request), on the cores the app runs on."""
    return url.startswith("https:")


def ask(client, request: dict) -> tuple[str, float, str]:
    """("answered" | "refused" | "no reply", seconds, detail) of one `/chat` request."""
    start = time.perf_counter()
    try:
        result, detail = client.ask(request)
    except Exception as error:  # a timeout, a dropped connection, a server crash
        result, detail = "no reply", f"{type(error).__name__}: {error}"[:200]
    return result, time.perf_counter() - start, detail


def run_burst(make_client, clients: int, per_client: int, bad_every: int) -> list[Outcome]:
    questions = questions_from(BUNDLED_DATA)
    outcomes, lock = [], threading.Lock()

    def client_thread(c: int):
        try:
            client = make_client()
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
                request.update(changes_for(changes, number))
            result, seconds, detail = ask(client, request)
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
        f"{sum(o.kind != 'valid' for o in answered)} clipped questions and new option pairs answered)",
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
    with tempfile.NamedTemporaryFile(suffix=".log") as app_log:
        try:
            options = [flag for flag, on in (("--no-warm-up", args.no_warm_up), ("--no-xla", args.no_xla)) if on]
            process, url = start_app(args.model, app_log, *options)
        except RuntimeError as error:
            print(f"error: {error}:\n{Path(app_log.name).read_text(errors='replace')[-3000:]}", file=sys.stderr)
            return 2
        outcomes, after = [], ("no reply", 0.0, "")
        try:
            print(f"app: {url} serving {args.model}; clients: {args.client}", flush=True)
            if not args.no_warm_up:
                print(f"waited {wait_for_warm_up(process, app_log.name):.0f} s for the app's warm-up", flush=True)
            make_client = lambda: CLIENTS[args.client](url, args.timeout)  # noqa: E731
            warm = ask(make_client(), {"message": "안녕하세요"})
            print(f"warm-up question: {warm[0]} in {warm[1]:.2f} s", flush=True)
            start = time.perf_counter()  # a first burst, not counted, meets every batch shape the app compiles
            run_burst(make_client, max(args.clients), 2, 0)
            print(f"warm-up burst ({max(args.clients)} clients x 2 valid requests) took "
                  f"{time.perf_counter() - start:.1f} s", flush=True)
            settled = resident_mib(process.pid)
            peak = [settled]
            sampling = threading.Event()
            threading.Thread(target=sample_memory, args=(process.pid, peak, sampling), daemon=True).start()
            for clients in args.clients:
                server, generator, start = cpu_seconds(process.pid), cpu_seconds(), time.perf_counter()
                burst = run_burst(make_client, clients, args.questions, args.bad_every)
                print(f"\n{clients} clients: burst took {time.perf_counter() - start:.1f} s; CPU: server "
                      f"{cpu_seconds(process.pid) - server:.1f} s, load generator {cpu_seconds() - generator:.1f} s")
                for line in report(burst, clients, args.questions):
                    print(line, flush=True)
                print(f"server memory: {resident_mib(process.pid):.0f} MiB after this burst, peak so far "
                      f"{max(peak):.0f} MiB ({max(peak) / settled:.2f}x the warmed-up server)", flush=True)
                outcomes += burst
            sampling.set()
            print(f"\nserver memory: {settled:.0f} MiB after the warm-up, peak {max(peak):.0f} MiB during the bursts "
                  f"({max(peak) / settled:.2f}x)", flush=True)
            after = ask(make_client(), {"message": "배고파"})
            print(f"after the bursts: {after[0]} in {after[1]:.2f} s {after[2]}".rstrip(), flush=True)
        finally:
            stop(process)
    return 1 if any(o.failed for o in outcomes) or after[0] != "answered" else 0


if __name__ == "__main__":
    sys.exit(main())

"""Cold start: how soon a user who starts the web app, or asks the command line one question, gets replies.

Starts `python app.py --model MODEL` as a user would (a subprocess on a free local port) and prints the seconds
until its page is served; then asks five questions of different lengths, one after another, through the app's
`/chat` API (bench/load_app.py's HTTP client, as the load test talks to it) and prints, for each reply, when it
arrived (after the page was served) and how long it took; then ends the app with Ctrl-C (SIGINT), as a user
does, and says whether it ended cleanly (status 0, no abort) while its XLA warm-up may still compile. Then runs
`python -m chatbot chat --model MODEL -q QUESTION` `--runs` times and prints the wall time of each subprocess,
end to end. It says whether the targets were met (on two cores: every one of the first five replies within 1 s
of the page being served, `chat -q` under 6 s); timings depend on the machine and its load, so they do not change
the exit status.

Exit status 1 if a reply did not come or Ctrl-C did not end the app cleanly, 2 if the app did not start or an
argument is bad.

    python bench/cold_start.py [--model models/default] [--runs 3] [--skip-app] [--skip-cli]
"""

import argparse
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import ROOT, stop
from load_app import PORT_ATTEMPTS, WARM_LINE, HttpClient, ask, free_port, port_was_taken

# Five questions from a word to the app's 200-character clip, so they meet different encoder lengths.
QUESTIONS = [
    "안녕",
    "오늘 너무 피곤해",
    "주말에 친구랑 영화 보러 갈까 하는데 뭐가 좋을까?",
    "요즘 회사 일이 너무 많아서 매일 야근하고 있어. 주말에도 쉬지 못하니까 몸도 마음도 지치는 것 같아. "
    "어떻게 하면 좀 나아질까?",
    "어제 오랜만에 고등학교 친구들을 만났는데, 다들 결혼하고 아이도 있고 집도 샀더라. 나만 제자리인 것 같아서 "
    "집에 오는 길에 괜히 마음이 복잡했어. 비교하지 말아야 한다는 건 아는데 자꾸 신경이 쓰여. 이런 마음은 "
    "어떻게 다스려야 할까?",
]
CLI_QUESTION = "오늘 너무 피곤해"
REPLY_TARGET = 1.0  # seconds after the page is served, for each of the first five replies
CLI_TARGET = 6.0  # seconds for `chat -q`, end to end


class Parser(argparse.ArgumentParser):
    def error(self, message):
        self.exit(2, f"error: {message}\n")


def parse_args(argv=None):
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "default"),
                        help="model directory (default: %(default)s)")
    parser.add_argument("--runs", type=int, default=3, help="times to run `chat -q` (default: %(default)s)")
    parser.add_argument("--skip-app", action="store_true", help="measure only the command line")
    parser.add_argument("--skip-cli", action="store_true", help="measure only the web app")
    parser.add_argument("--timeout", type=float, default=600, help="seconds to wait for the page or a reply")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model {args.model}: no model directory there")
    args.model = str(Path(args.model).resolve())  # the app and the command line run in the project's folder
    return args


def wait_for_page(process: subprocess.Popen, url: str, started: float, timeout: float) -> float | None:
    """Seconds from `started` until `url` answers (polled every 50 ms), or None if the app ended or never did."""
    while time.perf_counter() - started < timeout and process.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5) as page:
                if page.status == 200:
                    return time.perf_counter() - started
        except OSError:
            time.sleep(0.05)
    return None


def measure_app(model: str, timeout: float) -> bool:
    """Start the app, print when its page is served and when each of the first five replies arrives.
    True when every question was answered."""
    import httpx  # noqa: F401  (the client's import, before the clock starts: the bench's cost, not the app's)

    with tempfile.NamedTemporaryFile(suffix=".log") as log:
        process = None
        try:
            for _ in range(PORT_ATTEMPTS):  # another port if the one chosen was taken before the app listened on it
                port = free_port()
                url = f"http://127.0.0.1:{port}/"
                started = time.perf_counter()
                process = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--model", model, "--host",
                                            "127.0.0.1", "--port", str(port)], cwd=ROOT, stdout=log,
                                           stderr=subprocess.STDOUT)
                page = wait_for_page(process, url, started, timeout)
                if page is not None or not port_was_taken(process, log.name):
                    break
            if page is None:
                print(f"error: the app did not serve its page:\n{Path(log.name).read_text(errors='replace')[-3000:]}",
                      file=sys.stderr)
                sys.exit(2)
            print(f"app.py --model {model}: page served {page:.2f} s after start", flush=True)
            client, answered, in_time = HttpClient(url, timeout), True, True
            for number, question in enumerate(QUESTIONS, start=1):
                result, seconds, detail = ask(client, {"message": question})
                after_page = time.perf_counter() - started - page
                answered &= result == "answered"
                in_time &= after_page <= REPLY_TARGET
                print(f"  reply {number} ({len(question):3d} characters): {result} in {seconds:.2f} s, "
                      f"{after_page:.2f} s after the page {detail}".rstrip(), flush=True)
            warmed = WARM_LINE in Path(log.name).read_bytes()
            print(f"  the background XLA warm-up was {'done' if warmed else 'still running'} by then", flush=True)
            clean = ended_cleanly_by_ctrl_c(process, Path(log.name))
        finally:
            if process is not None:
                stop(process)
    met = "yes" if answered and in_time else "no"
    print(f"  every reply within {REPLY_TARGET:.0f} s of the page: {met}", flush=True)
    return answered and clean


def sigint_state(pid: int) -> str:
    """How the process stands with SIGINT (Linux's /proc): ignored, caught, pending, and how many of its threads
    block it: what to read first when a Ctrl-C never became Python's KeyboardInterrupt."""
    bit = 1 << (signal.SIGINT - 1)
    try:
        fields = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        blocking = sum(bool(int(line.split()[1], 16) & bit) for task in tasks
                       for line in (task / "status").read_text().splitlines() if line.startswith("SigBlk:"))
    except OSError as error:
        return f"its SIGINT state is unknown ({error})"
    flags = {name: bool(int(fields[key], 16) & bit) for name, key in
             (("ignored", "SigIgn"), ("caught", "SigCgt"), ("pending", "ShdPnd"))}
    said = ", ".join(f"{name} {flag}" for name, flag in flags.items())
    return f"SIGINT {said}, blocked in {blocking} of {len(tasks)} threads"


def ended_cleanly_by_ctrl_c(process: subprocess.Popen, log: Path, timeout: float = 60) -> bool:
    """Send SIGINT and print how the app ended: status 0 without an abort ("FATAL", "terminate called") is clean."""
    process.send_signal(signal.SIGINT)
    try:
        status = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  Ctrl-C: the app was still running {timeout:.0f} s later; {sigint_state(process.pid)}; its threads, "
              "as SIGABRT dumps them:", flush=True)
        process.send_signal(signal.SIGABRT)  # the app's faulthandler writes every thread's stack to its log
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        print("\n".join(f"    {line}" for line in log.read_text(errors="replace").splitlines()[-60:]), flush=True)
        return False
    aborted = any(note in log.read_bytes() for note in (b"FATAL", b"terminate called"))
    clean = status == 0 and not aborted
    print(f"  Ctrl-C: the app ended {'cleanly' if clean else 'badly'} (status {status}"
          f"{', aborted' if aborted else ''})", flush=True)
    return clean


def measure_cli(model: str, runs: int, timeout: float) -> bool:
    """Run `chat -q` `runs` times; print each wall time and the median. True when every run answered."""
    command = [sys.executable, "-m", "chatbot", "chat", "--model", model, "-q", CLI_QUESTION]
    seconds, ok = [], True
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        seconds.append(time.perf_counter() - start)
        answered = result.returncode == 0 and bool(result.stdout.strip())
        ok &= answered
        shown = result.stdout.strip() if answered else f"failed (status {result.returncode}): {result.stderr[-300:]}"
        print(f"chat -q {CLI_QUESTION!r}: {seconds[-1]:.2f} s end to end -> {shown}", flush=True)
        if result.stderr.strip() and answered:
            print(f"  and on stderr: {result.stderr.strip()[:300]}", flush=True)
    print(f"  median {statistics.median(seconds):.2f} s over {runs} run(s); every run under {CLI_TARGET:.0f} s: "
          f"{'yes' if ok and max(seconds) < CLI_TARGET else 'no'}", flush=True)
    return ok


def main(argv=None) -> int:
    args = parse_args(argv)
    ok = True
    if not args.skip_app:
        ok &= measure_app(args.model, args.timeout)
    if not args.skip_cli:
        ok &= measure_cli(args.model, args.runs, args.timeout)
    return 0 if ok else 1


if __name__ == "__main__":
    # Ctrl-C as a user's terminal sends it: where this bench was started with SIGINT ignored (a script's background
    # job, some CI runners), the app it starts would inherit that and ignore the Ctrl-C the bench sends.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())

"""Training across machines: TF_CONFIG read once, two workers on localhost train one model the chief saves."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chatbot.training.distributed import ClusterRole, read_tf_config, worker_out_dir
from conftest import PORT_ATTEMPTS, ROOT, TINY_PAIRS, saved_model_class, unused_port, write_csv

TINY_MODEL = ["--from-scratch", "--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--dff", "64", "--vocab-size", "200",
              "--max-length", "16", "--epochs", "1", "--batch-size", "16", "--repeats", "1"]


def tf_config(ports, index, kind="worker") -> str:
    return json.dumps({"cluster": {"worker": [f"localhost:{port}" for port in ports]},
                       "task": {"type": kind, "index": index}})


def test_the_chief_is_worker_0_unless_a_chief_is_named_and_only_it_writes_out(tmp_path):
    assert read_tf_config({"TF_CONFIG": tf_config([1, 2], 0)}).is_chief
    other = read_tf_config({"TF_CONFIG": tf_config([1, 2], 1)})
    assert not other.is_chief and other.workers == 2
    named = json.dumps({"cluster": {"chief": ["a:1"], "worker": ["b:2"]}, "task": {"type": "worker", "index": 0}})
    assert not read_tf_config({"TF_CONFIG": named}).is_chief
    assert worker_out_dir(tmp_path / "m", None) == tmp_path / "m"
    assert worker_out_dir(tmp_path / "m", other).name.startswith(".m.")


@pytest.mark.parametrize("value, reason", [
    ("", "needs TF_CONFIG"), ("{not json", "not a cluster description"), ('{"cluster": {}}', "not a cluster"),
    (tf_config([1, 2], 2), "task index 2"), (tf_config([1, 2], 0, kind="ps"), "chief or worker"),
    (json.dumps({"cluster": {"worker": ["nohost"]}, "task": {"type": "worker", "index": 0}}), "host:port"),
])
def test_a_bad_tf_config_is_a_value_error_that_says_why(value, reason):
    with pytest.raises(ValueError, match=reason):
        read_tf_config({"TF_CONFIG": value})
    assert isinstance(ClusterRole("worker", 0, 1), ClusterRole)


def train_two_workers(args_of, cwd: Path) -> list[tuple[str, str, int]]:
    """Two `train --strategy multi-worker` processes on localhost (`args_of(index)`): (stdout, stderr, status) of
    each. Their ports are chosen unused, so another process may take one before a worker listens on it; then
    that worker cannot start its server, the other is stopped and both start again on other ports."""
    for attempt in range(PORT_ATTEMPTS):
        ports = []
        while len(ports) < 2:
            port = unused_port()
            ports += [port] if port not in ports else []
        logs = [(cwd / f"worker{i}.out", cwd / f"worker{i}.err") for i in range(2)]
        workers = []
        for i, (out, err) in enumerate(logs):
            with open(out, "w") as stdout, open(err, "w") as stderr:
                workers.append(run_worker(args_of(i), tf_config(ports, i), cwd, stdout, stderr))
        deadline = time.monotonic() + 600
        while all(worker.poll() is None for worker in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        taken = any(worker.poll() not in (None, 0) and "Could not start gRPC server" in err.read_text()
                    for worker, (_, err) in zip(workers, logs))
        if taken and attempt < PORT_ATTEMPTS - 1:
            for worker in workers:
                worker.kill()
                worker.wait()
            continue
        for worker in workers:
            try:
                worker.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        results = [(out.read_text(), err.read_text(), worker.returncode) for worker, (out, err) in zip(workers, logs)]
        for path in (path for pair in logs for path in pair):
            path.unlink()
        return results


def run_worker(args, config: str, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE):
    """One `train --strategy multi-worker` process; with output to pipes, waited for: (stdout, stderr, status)."""
    env = {**os.environ, "TF_CONFIG": config, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT),
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "chatbot", "train", "--strategy", "multi-worker", *args],
                               cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=True)
    return process.communicate(timeout=600) + (process.returncode,) if stdout is subprocess.PIPE else process


def test_a_bad_tf_config_is_one_error_line_and_exit_2(tmp_path):
    csv = write_csv(tmp_path / "d.csv", TINY_PAIRS)
    out, err, status = run_worker(["--data", csv, "--out", tmp_path / "m", *TINY_MODEL], "{oops", tmp_path)
    assert status == 2 and [line for line in err.splitlines() if line.strip()][-1].startswith("error: TF_CONFIG")
    assert "Traceback" not in err and not (tmp_path / "m").exists()


@pytest.mark.slow  # two TensorFlow processes training together
def test_two_workers_train_one_model_that_the_chief_saves_and_answers(tmp_path):
    from chatbot.decoding.chatbot import Chatbot

    csv = write_csv(tmp_path / "d.csv", TINY_PAIRS)
    results = train_two_workers(lambda i: ["--data", csv, "--out", tmp_path / f"m{i}", *TINY_MODEL], tmp_path)
    assert [status for _, _, status in results] == [0, 0], [err[-2000:] for _, err, _ in results]
    assert "saved:" in results[0][0] and "chief saves the model" in results[1][0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["d.csv", "m0"]  # worker 1 left nothing behind
    assert saved_model_class(tmp_path / "m0") == "chatbot.model.transformer.Transformer"  # no multi-worker work-arounds in it
    # One model trained across both: each worker's strategy has both replicas (each reads half of every batch),
    # the epoch's loss each logs is the same, reduced across them, and it is the loss in the chief's history.
    assert all("2 replica(s)" in out for out, _, _ in results)
    losses = [re.findall(r"- loss: ([\d.]+)", out) for out, _, _ in results]
    assert losses[0] and losses[0][-1] == losses[1][-1], losses
    (row,) = csv_rows(tmp_path / "m0" / "history.csv")
    assert float(row["loss"]) == pytest.approx(float(losses[0][-1]), abs=1e-4)
    reply = Chatbot.load(tmp_path / "m0", compilation="eager").reply("배고파")  # one reply: nothing to trace
    assert reply.strip() and not any(special in reply for special in ("<pad>", "<s>", "</s>", "<sep>"))


def csv_rows(path):
    import csv

    with open(path, newline="") as file:
        return list(csv.DictReader(file))

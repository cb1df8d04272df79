"""Training across machines: TF_CONFIG read once, two workers on localhost train one model the chief saves."""

import json
import os
import socket
import subprocess
import sys

import pytest

from chatbot.cluster import ClusterRole, read_tf_config, worker_out_dir
from conftest import ROOT, TINY_PAIRS, write_csv

TINY_MODEL = ["--num-layers", "1", "--d-model", "32", "--num-heads", "2", "--dff", "64", "--vocab-size", "200",
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


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def run_worker(args, config: str, cwd, wait=True):
    env = {**os.environ, "TF_CONFIG": config, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(ROOT),
           "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "chatbot", "train", "--strategy", "multi-worker", *args],
                               cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return process.communicate(timeout=600) + (process.returncode,) if wait else process


def test_a_bad_tf_config_is_one_error_line_and_exit_2(tmp_path):
    csv = write_csv(tmp_path / "d.csv", TINY_PAIRS)
    out, err, status = run_worker(["--data", csv, "--out", tmp_path / "m", *TINY_MODEL], "{oops", tmp_path)
    assert status == 2 and [line for line in err.splitlines() if line.strip()][-1].startswith("error: TF_CONFIG")
    assert "Traceback" not in err and not (tmp_path / "m").exists()


@pytest.mark.slow  # two TensorFlow processes training together
def test_two_workers_train_one_model_that_the_chief_saves_and_answers(tmp_path):
    from chatbot.generate import Chatbot

    csv = write_csv(tmp_path / "d.csv", TINY_PAIRS)
    ports = free_ports(2)
    workers = [run_worker(["--data", csv, "--out", tmp_path / f"m{i}", *TINY_MODEL], tf_config(ports, i), tmp_path,
                          wait=False) for i in range(2)]
    results = [worker.communicate(timeout=600) + (worker.returncode,) for worker in workers]
    assert [status for _, _, status in results] == [0, 0], [err[-2000:] for _, err, _ in results]
    assert "saved:" in results[0][0] and "chief saves the model" in results[1][0]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["d.csv", "m0"]  # worker 1 left nothing behind
    reply = Chatbot.load(tmp_path / "m0", jit_compile="eager").reply("배고파")  # one reply: nothing to trace
    assert isinstance(reply, str)

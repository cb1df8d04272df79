import os
import subprocess
import sys

import pytest

from conftest import ROOT, TINY_PAIRS, write_csv


def run_cli(*args, stdin=None, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "chatbot", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_user_error(result, *words):
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize("command", [[], ["train"], ["chat"], ["export"], ["download"]])
def test_every_command_has_help(command):
    result = run_cli(*command, "--help")
    assert result.returncode == 0 and "usage:" in result.stdout


def bad_csvs(tmp_path):
    cp949 = tmp_path / "cp949_no_answer.csv"
    cp949.write_bytes("질문,라벨\n배고파,0\n".encode("cp949"))
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    blank_rows = write_csv(tmp_path / "blank.csv", [("", "", 0), ("  ", "", 1)])
    return [(cp949, "no answer column"), (empty, "empty"), (blank_rows, "no usable rows"),
            (tmp_path / "missing.csv", "not found")]


def test_bad_csvs_give_one_error_line_and_no_output(tmp_path):
    for csv, reason in bad_csvs(tmp_path):
        out = tmp_path / f"out-{csv.stem}"
        result = run_cli("train", "--data", csv, "--out", out)
        assert_user_error(result, reason, csv.name)
        assert not out.exists() and not out.with_name(out.name + ".training").exists()


def test_bad_settings_are_user_errors(tmp_path):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    assert_user_error(run_cli("train", "--data", csv, "--out", tmp_path / "m", "--d-model", "30", "--num-heads", "4"),
                      "divisible")
    assert_user_error(run_cli("chat", "--model", tmp_path / "nothing", "-q", "안녕"), "no model directory")


def test_chat_one_shot_and_piped(tiny_model_dir):
    one = run_cli("chat", "--model", tiny_model_dir, "--question", "배고파")
    assert one.returncode == 0 and one.stdout.strip() == "맛있는 거 드세요."
    piped = run_cli("chat", "--model", tiny_model_dir, stdin="안녕하세요\n잘 자\n")
    assert piped.stdout.splitlines() == ["반가워요.", "좋은 꿈 꾸세요."]
    assert_user_error(run_cli("chat", "--model", tiny_model_dir, "-q", "x", "--temperature", "0"), "temperature")


def test_train_refuses_to_overwrite(tiny_model_dir, tmp_path):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    before = (tiny_model_dir / "model.keras").stat().st_mtime_ns
    assert_user_error(run_cli("train", "--data", csv, "--out", tiny_model_dir), "already exists")
    assert (tiny_model_dir / "model.keras").stat().st_mtime_ns == before


def test_train_reads_several_csvs_with_a_report_each_and_a_total(tmp_path, capsys):
    from chatbot.cli import load_data

    first = write_csv(tmp_path / "a.csv", [("배고파", "밥 먹어요.", 0), ("졸려", "자요.", 0)])
    second = write_csv(tmp_path / "b.csv", [("배고파", "밥 먹어요.", 0), ("추워", "옷 입어요.", 0)])
    pairs = load_data([str(first), str(second)])
    out = capsys.readouterr().out
    assert [p.question for p in pairs] == ["배고파", "졸려", "추워"]
    assert out.count("data: ") == 2 and "total: 3 pairs from 2 files (1 pairs repeated" in out

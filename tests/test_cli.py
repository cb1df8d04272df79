"""`python -m chatbot`: help for every command, one `error:` line and status 2 for user mistakes.
Most checks call `cli.main` in this process; one runs the real `python -m chatbot` in a subprocess."""

import os
import subprocess
import sys

import pytest

from chatbot import cli
from conftest import ROOT, TINY_PAIRS, write_csv


def run_cli(*args, stdin=None, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "chatbot", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_user_error(status, stderr, *words):
    assert status == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    for word in words:
        assert word in lines[0]


def main(capsys, *args):
    """(exit status, stdout, stderr) of `python -m chatbot ARGS`, run in this process."""
    status = cli.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("command", [[], ["train"], ["chat"], ["export"], ["download"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out


def bad_csvs(tmp_path):
    cp949 = tmp_path / "cp949_no_answer.csv"
    cp949.write_bytes("질문,라벨\n배고파,0\n".encode("cp949"))
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    blank_rows = write_csv(tmp_path / "blank.csv", [("", "", 0), ("  ", "", 1)])
    return [(cp949, "no answer column"), (empty, "empty"), (blank_rows, "no usable rows"),
            (tmp_path / "missing.csv", "not found")]


def test_bad_csvs_give_one_error_line_and_no_output(tmp_path, capsys):
    for csv, reason in bad_csvs(tmp_path):
        out = tmp_path / f"out-{csv.stem}"
        status, _, err = main(capsys, "train", "--data", csv, "--out", out)
        assert_user_error(status, err, reason, csv.name)
        assert not out.exists() and not out.with_name(out.name + ".training").exists()


def test_bad_settings_are_user_errors(tmp_path, capsys, tiny_model_dir):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    assert_user_error(*main(capsys, "train", "--data", csv, "--out", tmp_path / "m", "--d-model", "30",
                            "--num-heads", "4")[::2], "divisible")
    assert_user_error(*main(capsys, "chat", "--model", tmp_path / "nothing", "-q", "안녕")[::2], "no model directory")
    assert_user_error(*main(capsys, "chat", "--model", tiny_model_dir, "-q", "x", "--temperature", "0")[::2],
                      "temperature")


def test_a_corrupt_model_is_a_user_error_too(tmp_path, capsys, tiny_model_dir):
    import shutil

    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    (broken / "model.keras").write_bytes(b"not a zip")
    assert_user_error(*main(capsys, "chat", "--model", broken, "-q", "안녕")[::2], "cannot load the model")
    assert_user_error(*main(capsys, "export", "--model", broken, "--out", tmp_path / "saved")[::2],
                      "cannot load the model")


def test_chat_one_shot(tiny_model_dir, capsys):
    status, out, _ = main(capsys, "chat", "--model", tiny_model_dir, "--question", "배고파")
    assert status == 0 and out.strip() == "맛있는 거 드세요."


@pytest.mark.slow  # a TensorFlow subprocess
def test_python_m_chatbot_answers_piped_lines(tiny_model_dir):
    piped = run_cli("chat", "--model", tiny_model_dir, stdin="안녕하세요\n잘 자\n")
    assert piped.returncode == 0, piped.stderr[-2000:]
    assert piped.stdout.splitlines() == ["반가워요.", "좋은 꿈 꾸세요."]


def test_train_refuses_to_overwrite(tiny_model_dir, tmp_path, capsys):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    before = (tiny_model_dir / "model.keras").stat().st_mtime_ns
    assert_user_error(*main(capsys, "train", "--data", csv, "--out", tiny_model_dir)[::2], "already exists")
    assert (tiny_model_dir / "model.keras").stat().st_mtime_ns == before


def test_train_reads_several_csvs_with_a_report_each_and_a_total(tmp_path, capsys):
    from chatbot.cli import load_data

    first = write_csv(tmp_path / "a.csv", [("배고파", "밥 먹어요.", 0), ("졸려", "자요.", 0)])
    second = write_csv(tmp_path / "b.csv", [("배고파", "밥 먹어요.", 0), ("추워", "옷 입어요.", 0)])
    pairs = load_data([str(first), str(second)])
    out = capsys.readouterr().out
    assert [p.question for p in pairs] == ["배고파", "졸려", "추워"]
    assert out.count("data: ") == 2 and "total: 3 pairs from 2 files (1 pairs repeated" in out

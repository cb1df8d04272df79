"""`python -m chatbot`: help for every command, one `error:` line and status 2 for user mistakes.
Most checks call `cli.main` in this process; one runs the real `python -m chatbot` in a subprocess."""

import io
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from chatbot.cli import main as cli, terminal
from conftest import ROOT, TINY_PAIRS, history_of, stages_run, write_csv


def run_cli(*args, stdin=None, cwd=ROOT):
    """`python -m chatbot ARGS` in a subprocess; `stdin` as str (output as str) or bytes (output as bytes)."""
    return subprocess.run([sys.executable, "-m", "chatbot", *map(str, args)], cwd=cwd, input=stdin,
                          capture_output=True, text=not isinstance(stdin, bytes), timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_user_error(status, stderr, *words):
    assert status == 2, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    for word in words:
        assert word in lines[0]


def main(capsys, *args):
    """(exit status, stdout, stderr) of `python -m chatbot ARGS`, run in this process."""
    try:
        status = cli.main([str(arg) for arg in args])
    except SystemExit as exited:  # argparse's own refusals
        status = exited.code
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize("command", [[], ["train"], ["chat"], ["export"], ["download"]])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*command, "--help"])
    assert exit_info.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("started_as, name", [("/venv/bin/chatbot", "chatbot"),
                                              ("/repo/chatbot/__main__.py", "python -m chatbot")])
def test_help_names_the_command_the_way_it_was_started(started_as, name, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [started_as])
    with pytest.raises(SystemExit):
        cli.main(["chat", "--help"])
    assert capsys.readouterr().out.startswith(f"usage: {name} chat")


def bad_csvs(tmp_path):
    cp949 = tmp_path / "cp949_no_answer.csv"
    cp949.write_bytes("질문,라벨\n배고파,0\n".encode("cp949"))
    empty = tmp_path / "empty.csv"
    empty.write_bytes(b"")
    blank_rows = write_csv(tmp_path / "blank.csv", [("", "", 0), ("  ", "", 1)])
    return [(cp949, "no answer column"), (empty, "empty"), (blank_rows, "no usable rows"),
            (tmp_path / "missing.csv", "not found")]


def test_a_mistake_in_flags_cluster_csv_or_model_is_said_before_tensorflow_loads(tmp_path):
    """TensorFlow takes seconds to load: the commands check what they can first. One process for every case,
    as a process that loaded TensorFlow once cannot show whether the next mistake would have loaded it."""
    csv, out, nothing = write_csv(tmp_path / "d.csv", TINY_PAIRS), tmp_path / "m", tmp_path / "nothing"
    mistakes = {  # command line -> what its error line says
        ("train", "--from-scratch", "--data", csv, "--out", out, "--d-model", "30"): "divisible",
        ("train", "--data", csv, "--out", out, "--strategy", "multi-worker"): "TF_CONFIG",
        ("train", "--data", tmp_path / "missing.csv", "--out", out): "not found",
        ("train", "--data", csv, "--out", tmp_path): "already exists",
        ("chat", "--model", nothing): "no model directory",
        ("eval", "--model", nothing, "--data", csv): "no model directory",
        ("export", "--model", nothing, "--out", tmp_path / "e"): "no model directory",
    }
    argvs = [[str(arg) for arg in argv] for argv in mistakes]
    script = ("import os, sys\nfrom chatbot.cli.main import main\nos.environ['TF_CONFIG'] = '{oops'\n"
              f"for argv in {argvs!r}:\n    print('status', main(argv))\n"
              "print('tensorflow loaded', 'tensorflow' in sys.modules)\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    told = [line for line in result.stdout.splitlines() if line.startswith(("status", "tensorflow"))]
    assert told == ["status 2"] * len(mistakes) + ["tensorflow loaded False"], result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(mistakes), errors
    assert all(words in line for line, words in zip(errors, mistakes.values())), errors


def test_bad_csvs_give_one_error_line_and_no_output(tmp_path, capsys):
    for csv, reason in bad_csvs(tmp_path):
        out = tmp_path / f"out-{csv.stem}"
        status, _, err = main(capsys, "train", "--data", csv, "--out", out)
        assert_user_error(status, err, reason, csv.name)
        assert not out.exists() and not out.with_name(out.name + ".training").exists()


def test_bad_settings_are_user_errors(tmp_path, capsys, tiny_model_dir):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    assert_user_error(*main(capsys, "train", "--from-scratch", "--data", csv, "--out", tmp_path / "m", "--d-model", "30",
                            "--num-heads", "4")[::2], "divisible")
    assert_user_error(*main(capsys, "chat", "--model", tmp_path / "nothing", "-q", "안녕")[::2], "no model directory")
    assert_user_error(*main(capsys, "chat", "--model", tiny_model_dir, "-q", "x", "--temperature", "0")[::2],
                      "temperature")
    for option in ("--seed", "--num-beams", "--max-new-tokens"):  # past a float's range, and negative
        for value in ("9" * 400, "-" + "9" * 400):
            assert_user_error(*main(capsys, "chat", "--model", tiny_model_dir, "-q", "x", option, value)[::2],
                              option[2:].replace("-", "_"))


def test_a_corrupt_model_is_a_user_error_too(tmp_path, capsys, tiny_model_dir):
    import shutil

    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    (broken / "model.keras").write_bytes(b"not a zip")
    assert_user_error(*main(capsys, "chat", "--model", broken, "-q", "안녕")[::2], "model.keras is damaged")
    assert_user_error(*main(capsys, "export", "--model", broken, "--out", tmp_path / "saved")[::2],
                      "model.keras is damaged")


def _edit_config(directory, **sections):
    import json

    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    for section, values in sections.items():
        config[section] = values if not isinstance(config.get(section), dict) else {**config[section], **values}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")


HOSTILE_MODELS = {  # model directories that must give one error line, never a traceback
    "model.keras a folder": lambda m: ((m / "model.keras").unlink(), (m / "model.keras").mkdir()),
    "model.keras empty": lambda m: (m / "model.keras").write_bytes(b""),
    "model.keras a zip of nothing": lambda m: (m / "model.keras").write_bytes(b"PK\x05\x06" + bytes(18)),
    "tokenizer.model garbage": lambda m: (m / "tokenizer.model").write_bytes(b"\x00" * 64),
    "tokenizer.model a folder": lambda m: ((m / "tokenizer.model").unlink(), (m / "tokenizer.model").mkdir()),
    "config.json a list": lambda m: (m / "config.json").write_text("[]"),
    "config.json not UTF-8": lambda m: (m / "config.json").write_bytes(b"\xff\xfe{"),
    "negative vocabulary": lambda m: _edit_config(m, model={"vocab_size": -5}),
    "heads not dividing d_model": lambda m: _edit_config(m, model={"num_heads": 7}),
    "other package version": lambda m: _edit_config(m, version="9.9.0"),
    "seed out of range": lambda m: _edit_config(m, train={"seed": 2**40}),
    "retrieval index edited": lambda m: (m / "retrieval.json").write_text('{"pairs": []}'),
    "retrieval index missing": lambda m: (m / "retrieval.json").unlink(),
    "retrieved count out of range": lambda m: _edit_config(m, context={"retrieved": 99}),
    "tone dropout not a number": lambda m: _edit_config(m, context={"tone_dropout": "lots"}),
    "config.json nested past the parser": lambda m: (m / "config.json").write_text("[" * 100_000 + "]" * 100_000),
    "retrieval.json nested past the parser": lambda m: (m / "retrieval.json").write_text("[" * 100_000),
    "model.keras is the sentence encoder": lambda m: shutil.copy(m / "sentence.keras", m / "model.keras"),
    "sentence.keras is the transformer": lambda m: shutil.copy(m / "model.keras", m / "sentence.keras"),
    "max_length beyond the network's": lambda m: _edit_config(m, model={"max_length": 1000, "encoder_length": 3000}),
    "embeddings.npy a link to /dev/zero": lambda m: ((m / "embeddings.npy").unlink(),
                                                     (m / "embeddings.npy").symlink_to("/dev/zero")),
    "embeddings.npy a FIFO": lambda m: ((m / "embeddings.npy").unlink(), os.mkfifo(m / "embeddings.npy")),
    "config.json a FIFO": lambda m: ((m / "config.json").unlink(), os.mkfifo(m / "config.json")),
}


@pytest.mark.parametrize("damage", HOSTILE_MODELS, ids=list(HOSTILE_MODELS))
def test_a_hostile_model_directory_is_one_error_line(tmp_path, capsys, tiny_model_dir, damage):
    import shutil

    model = shutil.copytree(tiny_model_dir, tmp_path / "hostile")
    HOSTILE_MODELS[damage](model)
    status, out, err = main(capsys, "chat", "--model", model, "-q", "안녕")
    assert_user_error(status, err)
    assert not out


def record_compilation(monkeypatch) -> list[str]:
    """`Chatbot.load`, unchanged, noting the `Compilation` each call asked for."""
    from chatbot.decoding.chatbot import Chatbot
    from chatbot.config import Compilation

    asked, load = [], Chatbot.load.__func__

    def recording(cls, path, compilation=Compilation.XLA):
        asked.append(Compilation(compilation))
        return load(cls, path, compilation)

    monkeypatch.setattr(Chatbot, "load", classmethod(recording))
    return asked


def test_chat_one_shot(tiny_model_dir, tiny_bot, capsys, monkeypatch):
    """One question decodes without XLA and eagerly: compiling, or tracing a graph, costs more than the reply."""
    import tensorflow as tf
    from chatbot.decoding.chatbot import Chatbot

    asked, compiled, reply = record_compilation(monkeypatch), [], Chatbot.reply

    def recording(bot, *args, **options):
        answer = reply(bot, *args, **options)
        compiled.extend(bot.compiled_plans)
        return answer

    monkeypatch.setattr(Chatbot, "reply", recording)
    status, out, _ = main(capsys, "chat", "--model", tiny_model_dir, "--question", "배고파")
    assert status == 0 and out.strip() == "맛있는 거 드세요."
    assert asked == ["eager"] and compiled == [] and not tf.config.functions_run_eagerly()  # no global switch

    question = "오늘 회사에서 혼났어"
    out = main(capsys, "chat", "--model", tiny_model_dir, "-q", question, "--strategy", "sample", "--seed", "5")[1]
    eager = Chatbot(tiny_bot.model, tiny_bot.tokenizer, tiny_bot.config, retriever=tiny_bot.retriever,
                    compilation="eager")  # the same draw as the graph's (test_engine.py)
    assert out.strip() == eager.reply(question, strategy="sample", seed=5)


@pytest.mark.slow  # a TensorFlow subprocess
def test_python_m_chatbot_answers_piped_lines_and_keeps_answering_after_bytes_that_are_not_utf8(tiny_model_dir):
    piped = run_cli("chat", "--model", tiny_model_dir, stdin="안녕하세요\n".encode() + b"\xff\xfe\n" + "잘 자\n".encode())
    assert piped.stdout.decode().splitlines() == ["반가워요.", "", "좋은 꿈 꾸세요."], piped.stderr.decode()[-2000:]
    assert_user_error(piped.returncode, piped.stderr.decode(), "1 line(s) were not answered")


def test_train_refuses_to_overwrite(tiny_model_dir, tmp_path, capsys):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    before = (tiny_model_dir / "model.keras").stat().st_mtime_ns
    assert_user_error(*main(capsys, "train", "--data", csv, "--out", tiny_model_dir)[::2], "already exists")
    assert (tiny_model_dir / "model.keras").stat().st_mtime_ns == before


def test_train_reads_several_csvs_with_a_report_each_and_a_total(tmp_path, capsys):
    from chatbot.data.datasets import load_sources

    first = write_csv(tmp_path / "a.csv", [("배고파", "밥 먹어요.", 0), ("졸려", "자요.", 0)])
    second = write_csv(tmp_path / "b.csv", [("배고파", "밥 먹어요.", 0), ("추워", "옷 입어요.", 0)])
    pairs = load_sources([str(first), str(second)])
    out = capsys.readouterr().out
    assert [p.question for p in pairs] == ["배고파", "졸려", "추워"]
    assert out.count("data: ") == 2 and "total: 3 pairs from 2 files (1 pairs repeated" in out


# -- every hostile input below is one `error:` line and status 2, never a traceback --

# A run whose model is beside the point (folders, logs, refusals): a one-layer network that reads the question
# alone (no sentence encoder to fit), each pair once: seconds, where train's defaults cost half a minute.
SMALL_RUN = ("--epochs", "1", "--repeats", "1", "--num-layers", "1", "--d-model", "32", "--num-heads", "2",
             "--dff", "64", "--vocab-size", "200", "--retrieved", "0", "--select", "last")


def train_args(tmp_path, *extra, out=None):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    return ["train", "--from-scratch", "--data", csv, "--out", out or tmp_path / "m", *SMALL_RUN, *extra]


@pytest.mark.parametrize("extra, words", [
    (["--fallback", "가" * 1060], ["fallback", "too long"]), (["--fallback", "\u200b"], ["fallback", "visible"]),
    (["--fallback", " \u3000\x1e"], ["fallback", "visible"]),
    (["--seed", "3e9"], ["--seed", "invalid int"]), (["--seed", "3000000000"], ["seed"]), (["--seed", "-1"], ["seed"]),
    (["--max-length", "2"], ["max_length"]), (["--epochs", "many"], ["--epochs"])])
def test_bad_training_numbers_are_one_error_line(tmp_path, capsys, extra, words):
    assert_user_error(*main(capsys, *train_args(tmp_path, *extra))[::2], *words)
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.training").exists()


def test_out_inside_a_file_and_an_over_long_name_are_refused_before_reading_data(tmp_path, capsys):
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    status, out, err = main(capsys, *train_args(tmp_path, out=a_file / "model"))
    assert_user_error(status, err, "is a file")
    assert "data:" not in out
    assert_user_error(*main(capsys, *train_args(tmp_path, out=tmp_path / ("모" * 100)))[::2], "too long")
    assert_user_error(*main(capsys, "export", "--model", tmp_path, "--out", a_file / "saved")[::2], "is a file")


def test_an_unwritable_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)  # the tests run as root, who may write anywhere
    assert_user_error(*main(capsys, *train_args(tmp_path, out=tmp_path / "locked" / "m"))[::2], "permission denied")


def test_a_permission_error_while_training_is_one_line(tmp_path, capsys, monkeypatch):
    import chatbot.training.train

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "m.training"))

    monkeypatch.setattr(chatbot.training.train, "train", refuse)
    assert_user_error(*main(capsys, *train_args(tmp_path))[::2], "Permission denied", "m.training")


def test_a_vocabulary_too_small_for_the_data_is_one_error_line(tmp_path, capsys):
    status, _, err = main(capsys, *train_args(tmp_path, "--vocab-size", "16"))
    assert_user_error(status, err, "--vocab-size 16")
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.training").exists()


@pytest.mark.parametrize("question, words", [("", ["empty"]), ("   ", ["empty"]), ("가" * 1001, ["too long", "1,000"])])
def test_chat_refuses_empty_and_over_long_questions(tiny_model_dir, capsys, question, words):
    assert_user_error(*main(capsys, "chat", "--model", tiny_model_dir, "-q", question)[::2], *words)


def test_an_ngram_size_past_the_models_max_length_is_one_error_line(tiny_model_dir, capsys):
    assert_user_error(*main(capsys, "chat", "--model", tiny_model_dir, "-q", "배고파", "--no-repeat-ngram-size",
                            "17")[::2], "no_repeat_ngram_size", "max_length")


@pytest.mark.slow  # traces a fresh model's reply graph in the background
def test_a_conversation_traces_its_reply_graph_while_the_first_question_is_typed(tiny_model_dir):
    bot = terminal.load_for_chat(str(tiny_model_dir), {}, "graph")
    bot.trace_in_background().join(timeout=300)
    assert bot.ready(bot.plan(bot.check()))
    ran = stages_run(bot)
    assert bot.reply("배고파") == "맛있는 거 드세요."
    assert ran == []  # the reply traced nothing


@pytest.mark.slow  # traces a fresh model's reply graph in the background
def test_a_conversation_answers_each_line_even_while_its_graph_is_still_being_traced(tiny_model_dir, capsys,
                                                                                     monkeypatch):
    import builtins
    import types

    lines = iter(["안녕하세요", "", "never asked"])  # typed at once: the first reply meets the trace running
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    status, out, err = main(capsys, "chat", "--model", tiny_model_dir)
    assert status == 0, err
    assert out.splitlines()[1:] == ["챗봇> 반가워요."]  # after the greeting; an empty line ends the chat


@pytest.mark.parametrize("flags, context", [([], True), (["--no-context"], False)])
def test_a_conversation_keeps_its_context_until_new_and_no_context_answers_each_line_alone(tiny_model_dir, tiny_bot,
                                                                                         capsys, monkeypatch, flags,
                                                                                         context):
    import builtins
    import types

    first, reply = (m["content"] for m in history_of("d1"))
    lines = iter([first, "응", "/new", "응", ""])
    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(isatty=lambda: True))
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    bot = tiny_bot  # the model the command would load, its graphs traced already: what is tested is the REPL
    monkeypatch.setattr(terminal, "load_for_chat", lambda *_, **__: bot)
    status, out, err = main(capsys, "chat", "--model", tiny_model_dir, *flags)
    assert status == 0, err
    said = [line.removeprefix("챗봇> ") for line in out.splitlines()[1:]]
    asked = bot.reply(first)
    assert said[0] == asked
    followed = bot.reply("응", history=[{"role": "user", "content": first}, {"role": "assistant", "content": asked}])
    assert said[1] == (followed if context else bot.reply("응"))
    assert said[2:] == ["(새 대화)", bot.reply("응")]


@pytest.mark.slow  # a TensorFlow subprocess
def test_a_conversation_ended_at_once_waits_for_its_trace_and_exits_cleanly(tiny_model_dir):
    """Ending the chat while the background trace runs: a process that exits with a thread inside TensorFlow
    aborts ("FATAL: exception not rethrown")."""
    script = ("import builtins, sys, types\n"
              "sys.stdin = types.SimpleNamespace(isatty=lambda: True)\n"
              "builtins.input = lambda prompt='': ''\n"
              "from chatbot.cli.main import main\n"
              f"sys.exit(main(['chat', '--model', {str(tiny_model_dir)!r}]))\n")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0 and "FATAL" not in run.stderr, run.stderr[-2000:]
    assert run.stdout.startswith("chatbot (")


@pytest.mark.slow  # loads the model and compiles its chat loop
def test_piped_lines_all_answered_exit_with_status_0(tiny_model_dir, capsys, monkeypatch):
    import io
    import types

    piped = types.SimpleNamespace(isatty=lambda: False, buffer=io.BytesIO("안녕하세요\n잘 자\n".encode()))
    monkeypatch.setattr(sys, "stdin", piped)
    asked = record_compilation(monkeypatch)
    status, out, err = main(capsys, "chat", "--model", tiny_model_dir)
    assert status == 0, err
    assert out.splitlines() == ["반가워요.", "좋은 꿈 꾸세요."]
    assert asked == ["xla"]  # piped lines, often many, are worth compiling


def test_piped_lines_that_are_not_utf8_or_too_long_are_skipped_and_the_rest_answered(tiny_bot, capsys):
    import io

    lines = io.BytesIO("안녕하세요\n".encode() + "배고파\n".encode("cp949") + b"\n" + ("가" * 5000).encode() + b"\n"
                       + "잘 자\n".encode())
    with pytest.raises(terminal.UserError, match=r"2 line\(s\) were not answered \(line 2, 4"):
        terminal.answer_lines(tiny_bot, lines, {})
    out, err = capsys.readouterr()
    assert out.splitlines() == ["반가워요.", "", "", "", "좋은 꿈 꾸세요."]
    assert "skipped line 2: not UTF-8" in err and "skipped line 4: the question is too long" in err


def test_a_tokenizer_that_does_not_match_the_model_is_refused_on_load(tiny_model_dir, tmp_path, capsys):
    import json
    import shutil

    from chatbot.tokenizer.subword import Tokenizer

    hostile = shutil.copytree(tiny_model_dir, tmp_path / "hostile")
    other = Tokenizer.train([q for q, _, _ in TINY_PAIRS], 130)
    assert other.vocab_size != Tokenizer.load(hostile / "tokenizer.model").vocab_size
    other.save(hostile / "tokenizer.model")
    config = json.loads((hostile / "config.json").read_text(encoding="utf-8"))
    config["tokenizer"]["vocab_hash"] = other.vocab_hash  # the hash check alone cannot catch it
    (hostile / "config.json").write_text(json.dumps(config), encoding="utf-8")
    assert_user_error(*main(capsys, "chat", "--model", hostile, "-q", "안녕")[::2], "different runs")


@pytest.mark.parametrize("config_text", ["{not json", "[]", '{"model": {"num_heads": "4"}}', '{"model": 3}'])
def test_a_model_directory_with_a_bad_config_is_refused(tiny_model_dir, tmp_path, capsys, config_text):
    import shutil

    hostile = shutil.copytree(tiny_model_dir, tmp_path / "hostile")
    (hostile / "config.json").write_text(config_text, encoding="utf-8")
    assert_user_error(*main(capsys, "chat", "--model", hostile, "-q", "안녕")[::2], "config.json")


class PipedStdin:
    """What `sys.stdin` is when lines are piped in: not a terminal, read as bytes."""

    def __init__(self, data: bytes):
        self.buffer = io.BytesIO(data)

    def isatty(self):
        return False


def test_a_one_megabyte_piped_line_is_refused_before_the_model_loads(tiny_model_dir, tmp_path, capsys, monkeypatch):
    """Its model.keras is garbage, which only loading finds: a 1 MB line is refused without loading it, while a
    question that needs a reply meets the load's error."""
    import shutil

    broken = shutil.copytree(tiny_model_dir, tmp_path / "broken")
    (broken / "model.keras").write_bytes(b"not a keras file")
    monkeypatch.setattr(sys, "stdin", PipedStdin(b"a" * 1_000_000 + b"\n"))
    status, out, err = main(capsys, "chat", "--model", broken)
    assert out.splitlines() == [""]
    assert_user_error(status, err, "line 1", "too long", "1,000,000 characters")
    monkeypatch.setattr(sys, "stdin", PipedStdin("안녕\n".encode()))
    status, _, err = main(capsys, "chat", "--model", broken)
    assert_user_error(status, err, "model.keras is damaged")


@pytest.mark.slow  # a TensorFlow subprocess loading the full-size default model
def test_a_one_megabyte_piped_line_ends_with_one_clear_error_line():
    """An over-long piped line is refused before it reaches the model: one empty reply line, one error line."""
    piped = run_cli("chat", "--model", ROOT / "models" / "default", stdin=b"a" * 1_000_000 + b"\n")
    assert piped.stdout.decode().splitlines() == [""]
    assert_user_error(piped.returncode, piped.stderr.decode(), "line 1", "too long", "1,000,000 characters")


# -- --overwrite replaces only what the command itself wrote --

@pytest.mark.parametrize("command", ["train", "export"])
def test_overwrite_never_replaces_the_current_folder_or_its_parents(tiny_model_dir, tmp_path, capsys, monkeypatch,
                                                                    command):
    work = tmp_path / "work" / "here"
    work.mkdir(parents=True)
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    args = train_args(tmp_path) if command == "train" else ["export", "--model", tiny_model_dir]
    for out in (".", "..", str(work), "./"):
        args_out = [*args[:args.index("--out") + 1], out, *args[args.index("--out") + 2:]] if "--out" in args \
            else [*args, "--out", out]
        assert_user_error(*main(capsys, *args_out, "--overwrite")[::2], "current folder")
    assert (work / "notes.txt").read_text() == "mine"


def test_overwrite_refuses_a_folder_the_command_did_not_write(tiny_model_dir, tmp_path, capsys):
    mine = tmp_path / "mydocs"
    mine.mkdir()
    (mine / "letter.txt").write_text("keep me")
    assert_user_error(*main(capsys, "export", "--model", tiny_model_dir, "--out", mine, "--overwrite")[::2],
                      "not a SavedModel")
    assert_user_error(*main(capsys, *train_args(tmp_path, "--overwrite", out=mine))[::2], "not a model directory")
    assert (mine / "letter.txt").read_text() == "keep me"


def test_overwrite_refuses_a_project_folder_that_has_a_config_json(tiny_model_dir, tmp_path, capsys):
    """A `config.json` does not make a folder a model directory: `myapp/` with `main.py` beside it is the user's,
    and `train --overwrite` must leave it whole. A model directory `train` wrote is still replaced."""
    app_dir = tmp_path / "myapp"
    app_dir.mkdir()
    for name, text in {"config.json": "{}", "main.py": "print('hi')", "data.txt": "내 데이터"}.items():
        (app_dir / name).write_text(text, encoding="utf-8")
    assert_user_error(*main(capsys, *train_args(tmp_path, "--overwrite", out=app_dir))[::2], "not a model directory")
    assert sorted(p.name for p in app_dir.iterdir()) == ["config.json", "data.txt", "main.py"]
    own = shutil.copytree(tiny_model_dir, tmp_path / "own")
    status, out, err = main(capsys, *train_args(tmp_path, "--overwrite", out=own))
    assert status == 0, err


def test_export_refuses_a_link_or_a_file_at_once(tiny_model_dir, tmp_path, capsys):
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    assert_user_error(*main(capsys, "export", "--model", tiny_model_dir, "--out", dangling, "--overwrite")[::2],
                      "is a link")
    assert_user_error(*main(capsys, "export", "--model", tiny_model_dir, "--out", a_file, "--overwrite")[::2],
                      "is a file")
    assert a_file.read_text() == "x"


@pytest.mark.slow  # exports
def test_export_overwrites_its_own_savedmodel_and_leaves_nothing_beside_it(tiny_model_dir, tiny_saved_model, tmp_path,
                                                                          capsys):
    import shutil

    out = tmp_path / "saved"
    shutil.copytree(tiny_saved_model, out)  # what `export` wrote there before
    first = (out / "saved_model.pb").stat().st_mtime_ns
    assert main(capsys, "export", "--model", tiny_model_dir, "--out", out, "--overwrite")[0] == 0
    assert (out / "saved_model.pb").stat().st_mtime_ns != first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["saved"]  # no temporaries, no old copy


def test_a_max_length_no_answer_fits_is_one_error_line_before_training(tmp_path, capsys):
    rows = [(q, "그 마음 충분히 이해해요. 오늘은 천천히 쉬면서 좋아하는 음악을 들어 봐요.", label)
            for q, _, label in TINY_PAIRS]
    csv = write_csv(tmp_path / "long_answers.csv", rows)
    status, _, err = main(capsys, "train", "--from-scratch", "--data", csv, "--out", tmp_path / "m", "--max-length", "4")
    assert_user_error(status, err, "no training answer fits", "max_length 4")
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.training").exists()


def test_train_makes_the_folders_above_its_out(tmp_path, capsys):
    out = tmp_path / "not" / "yet" / "mine"
    status, _, err = main(capsys, *train_args(tmp_path, out=out))
    assert status == 0, err
    assert (out / "model.keras").is_file()


def test_the_log_counts_each_pair_skipped_for_a_long_answer_once_not_once_per_repeat(tmp_path, capsys):
    long = "오늘 하루도 정말 고생 많았어요. 따뜻한 물 한 잔 마시고 좋아하는 음악을 들으면서 천천히 쉬어 보세요. 내일은 분명 더 나을 거예요."
    rows = [*TINY_PAIRS, ("진짜 너무 지쳤어", long, 1), ("오늘 하루 길었다", long + " 푹 자요.", 0)]
    status, out, err = main(capsys, "train", "--from-scratch", "--data", write_csv(tmp_path / "long.csv", rows), "--out", tmp_path / "m",
                            *SMALL_RUN, "--repeats", "3", "--max-length", "24")
    assert status == 0, err
    assert "2 training pairs skipped: their answer is longer than 24 tokens" in out


def test_a_new_csv_builds_on_the_base_model_keeps_its_vocabulary_and_reads_meaning_with_e5(tmp_path, capsys,
                                                                                            tiny_model_dir):
    """By default `train` builds on --base: the new model keeps the base's vocabulary and network shape, indexes
    only the new pairs by the meaning multilingual-e5-small reads in them (their answer documents' embeddings and
    the projection learned from its questions are saved with it) and calibrates its own fallback threshold, however
    long it trains (here one pass over the pairs). (What such a model answers is measured on the default model by bench/small_csv.py: the
    tiny base's 200 pieces cannot spell a new answer.)"""
    import json

    from chatbot.config import FOR_OWN_DATA
    from chatbot.decoding.chatbot import Chatbot

    faq = [(question, answer, 0) for pair in (
        ("몇 시에 열어요?", "언제 문 열어요?", "아침 9시에 열어요."), ("주차 돼요?", "차 댈 곳 있어요?", "건물 뒤에 대세요."),
        ("쉬는 날 언제예요?", "월요일도 해요?", "월요일은 쉬어요."), ("카드 돼요?", "현금만 받아요?", "카드도 돼요."),
        ("포장 되나요?", "테이크아웃 할인 있어요?", "포장하면 300원 빼 드려요."),
        ("강아지 데려가도 돼요?", "반려견 동반 가능해요?", "작은 강아지는 괜찮아요."))
        for question, answer in ((pair[0], pair[2]), (pair[1], pair[2]))]
    csv, out = write_csv(tmp_path / "faq.csv", faq), tmp_path / "faq-model"
    status, printed, err = main(capsys, "train", "--base", tiny_model_dir, "--data", csv, "--out", out,
                                "--fallback", "가게로 전화 주세요.", "--epochs", "1", "--repeats", "1")
    assert status == 0, err
    assert f"building on {tiny_model_dir}" in printed
    config, base = (json.loads((folder / "config.json").read_text()) for folder in (out, tiny_model_dir))
    assert config["tokenizer"] == base["tokenizer"] and config["model"] == base["model"]
    assert config["base"] == str(tiny_model_dir) and config["retrieval"]["fallback"] == "가게로 전화 주세요."
    assert (out / "pretrained.npy").is_file() and (out / "projection.npy").is_file()
    assert not (out / "sentence.keras").exists()
    assert {name: config["retrieval"][name] for name in FOR_OWN_DATA} == FOR_OWN_DATA
    bot = Chatbot.load(out, compilation="graph")
    assert [p.question for p in bot.retriever.pairs] == [q for q, _, _ in faq]
    assert 0 < bot.retriever.config.threshold < 1  # calibrated on the questions that share an answer
    # the saved embeddings are every answer document's (training's reused, the rest embedded), small talk's too
    from chatbot.model.pretrained import embed
    from chatbot.retrieval.retriever import PRETRAINED_PREFIXES, answer_documents
    index = bot.retriever.pretrained
    fresh = embed(index.encoder, index.tokenizer, answer_documents(bot.retriever.pairs)[0], PRETRAINED_PREFIXES[1])
    assert np.allclose(index.embeddings.numpy(), fresh, atol=2e-3)  # saved as float16


def test_network_flags_without_from_scratch_and_a_missing_base_are_one_error_line(tmp_path, capsys):
    csv = write_csv(tmp_path / "ok.csv", TINY_PAIRS)
    assert_user_error(*main(capsys, "train", "--data", csv, "--out", tmp_path / "m", "--d-model", "64")[::2],
                      "--d-model", "--from-scratch")
    assert_user_error(*main(capsys, "train", "--base", tmp_path / "nowhere", "--data", csv, "--out",
                            tmp_path / "m")[::2], "--base", "--from-scratch")
    assert not (tmp_path / "m").exists()


def test_ctrl_c_swallowed_by_a_garbage_collection_hook_still_stops_training(tmp_path, capsys, monkeypatch):
    """SIGINT that arrives while a gc callback runs (JAX installs one) raises its KeyboardInterrupt inside the
    callback, where Python prints and swallows it. Training must stop all the same: "error: interrupted", status
    130, no model."""
    import gc
    import signal

    import chatbot.training.train

    fit = chatbot.training.train.fit

    def interrupted_in_a_gc_hook(*args, **kwargs):
        def hook(phase, info):
            if phase == "start" and hook in gc.callbacks:
                gc.callbacks.remove(hook)
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(100_000):  # Python runs the signal handler here, inside the hook
                    pass
        gc.callbacks.append(hook)
        gc.collect()
        return fit(*args, **kwargs)

    monkeypatch.setattr(chatbot.training.train, "fit", interrupted_in_a_gc_hook)
    status, out, err = main(capsys, *train_args(tmp_path))
    assert status == 130 and "error: interrupted" in err
    assert not (tmp_path / "m").exists()

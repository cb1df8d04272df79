"""The package's front door: `from chatbot import Chatbot`, loaded lazily."""

import re
import subprocess
import sys

import chatbot
from conftest import ROOT


def test_importing_chatbot_loads_no_tensorflow_until_a_name_needs_it():
    code = ("import sys, chatbot, chatbot.cli.main, chatbot.data.datasets\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow loaded on import'\n"
            "assert {'Chatbot', 'load_source', 'download_chatbot_data'} <= set(dir(chatbot))\n"
            "chatbot.load_source, chatbot.download_chatbot_data, chatbot.__version__\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow loaded by a light name'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_from_chatbot_import_chatbot_replies_in_korean(tiny_model_dir):
    """(The full-size default model's replies are checked in test_default_model.py, in the slow lane.)"""
    from chatbot import Chatbot
    from chatbot.decoding.chatbot import Chatbot as Same

    assert Chatbot is Same
    assert re.search("[가-힣]", Chatbot.load(tiny_model_dir, compilation="eager").reply("안녕"))


def test_an_unknown_name_is_an_attribute_error():
    assert not hasattr(chatbot, "no_such_name")


CONSOLE_SCRIPT = """
import sys
from importlib.metadata import EntryPoint
sys.argv = ["chatbot", *sys.argv[1:]]
sys.exit(EntryPoint("chatbot", sys.argv.pop(1), "console_scripts").load()())
"""


def test_the_chatbot_console_command_resolves_and_runs_its_help():
    """pyproject.toml's `chatbot` command, run as the script pip writes for it runs it (`sys.exit(main())`, with
    the command's own name in argv): installed or not, it must name a function that runs the command line."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["scripts"]
    result = subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, scripts["chatbot"], "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: chatbot ")
    assert all(command in result.stdout for command in ("train", "chat", "eval", "export", "download"))

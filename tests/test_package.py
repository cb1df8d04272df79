"""The package's front door: `from chatbot import Chatbot`, loaded lazily."""

import re
import subprocess
import sys

import chatbot
from conftest import ROOT


def test_importing_chatbot_loads_no_tensorflow_until_a_name_needs_it():
    code = ("import sys, chatbot, chatbot.cli, chatbot.datasets\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow loaded on import'\n"
            "assert {'Chatbot', 'load_source', 'download_chatbot_data'} <= set(dir(chatbot))\n"
            "chatbot.load_source, chatbot.download_chatbot_data, chatbot.__version__\n"
            "assert 'tensorflow' not in sys.modules, 'TensorFlow loaded by a light name'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_from_chatbot_import_chatbot_replies_in_korean(tiny_model_dir):
    """(The full-size default model's replies are checked in test_default_model.py, in the slow lane.)"""
    from chatbot import Chatbot
    from chatbot.generate import Chatbot as Same

    assert Chatbot is Same
    assert re.search("[가-힣]", Chatbot.load(tiny_model_dir, jit_compile="eager").reply("안녕"))


def test_an_unknown_name_is_an_attribute_error():
    assert not hasattr(chatbot, "no_such_name")

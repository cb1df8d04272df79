"""한국어 트랜스포머 챗봇 (Korean transformer chatbot): the package's front door.

    from chatbot import Chatbot
    bot = Chatbot.load("models/default")
    bot.reply("안녕")

Names follow the `python -m chatbot` commands: `chat` is `Chatbot.load(...).reply(...)`, `download`
is `download_chatbot_data`, `export` is `export_saved_model`, and `train --data` reads through
`load_source` (a CSV path or `tfds:korean_chatbot_data`); training itself is `chatbot.training.train.train`.
Everything is imported on first use, so `import chatbot` (and `python -m chatbot --help`) does
not load TensorFlow. Must not hold logic of its own.
"""

from importlib import import_module

from chatbot.config import __version__

_LAZY = {
    "Chatbot": "chatbot.decoding.chatbot",
    "ChatbotConfig": "chatbot.config",
    "GenerationConfig": "chatbot.config",
    "load_source": "chatbot.data.datasets",
    "download_chatbot_data": "chatbot.data.download",
    "export_saved_model": "chatbot.serving.saved_model",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'chatbot' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted({*globals(), *_LAZY})

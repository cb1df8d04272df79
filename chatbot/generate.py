"""`Chatbot` under its earlier module name, for code that still imports it from here with `jit_compile`.

Owns nothing: the reply engine is `chatbot.engine`. Training builds its bots here (`jit_compile`: True for
XLA, False for a plain graph, "eager"); new code imports `chatbot.engine.Chatbot` and names a `Compilation`.
Must not grow logic of its own.
"""

from __future__ import annotations

from chatbot import engine
from chatbot.engine import Compilation


class Chatbot(engine.Chatbot):
    """`chatbot.engine.Chatbot`, built with `jit_compile` as before."""

    def __init__(self, model, tokenizer, config, path=None, retriever=None, jit_compile: bool | str = True):
        if isinstance(jit_compile, Compilation):  # from `Chatbot.load`
            compilation = jit_compile
        else:
            compilation = Compilation.EAGER if jit_compile == "eager" else (
                Compilation.XLA if jit_compile else Compilation.GRAPH)
        super().__init__(model, tokenizer, config, path, retriever, compilation)

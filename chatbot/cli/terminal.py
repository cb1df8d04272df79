"""`python -m chatbot chat`: a conversation in the terminal.

Owns: the chat command's three forms (one `--question`, a REPL, one reply per piped line), loading
the model only once a reply needs it, tracing the REPL's reply graph while its first question is typed,
and `UserError`, the one-line mistake every command raises.
Must not parse arguments (that is `chatbot.cli.main`) or import TensorFlow before a model is loaded.
"""

from __future__ import annotations

import sys

from chatbot.artifacts import check_model_dir
from chatbot.config import CONTEXT_TURNS, Compilation
from chatbot.data.text import check_questions


NEW_CONVERSATION = ("/new", "/새대화")  # REPL lines that start a new conversation


class UserError(Exception):
    """A mistake the user can fix; printed as one line."""


def check_question(text: str) -> str:
    """A question the model can answer: within `text.check_questions`' rule (the one every entry point applies)."""
    try:
        check_questions([text])
    except ValueError as error:
        raise UserError(str(error)) from None
    return text


def chat(model: str, question: str | None, decoding: dict, load_tensorflow=lambda: None, context: bool = True) -> None:
    """Answer `question`, or each piped line of stdin (each on its own), or talk in a REPL (which keeps the
    conversation unless `context` is False); `decoding`: checked options and tone. `load_tensorflow` is called
    once the question and the model directory are checked."""
    if question is not None:
        check_question(question)
    check_model_dir(model)
    load_tensorflow()
    if question is None and not sys.stdin.isatty():
        answer_lines(ModelOnFirstUse(model, decoding), sys.stdin.buffer, decoding)
        return
    bot = load_for_chat(model, decoding, Compilation.EAGER if question is not None else Compilation.GRAPH)
    if question is not None:
        print(bot.reply(question, **decoding))
    else:
        tracing = bot.trace_in_background(**decoding)  # while the user types the first question
        try:
            chat_interactively(bot, model, decoding, context)
        finally:
            tracing.join()  # a process that exits while a thread is inside TensorFlow aborts


def load_for_chat(model: str, decoding: dict, compilation: Compilation | str = Compilation.XLA):
    """The model, with the decoding options that depend on it checked (no_repeat_ngram_size vs its max_length).
    A conversation decodes as a plain graph (`Compilation.GRAPH`): XLA compiles once per batch and
    question-length bucket, seconds each on a CPU, so the first reply and each reply to a question of a new
    length would wait 5 s for a reply that takes 50 ms uncompiled; many piped lines are worth it. One question
    runs eagerly (`Compilation.EAGER`): tracing the loop would cost more than running it once."""
    from chatbot.decoding.chatbot import Chatbot

    bot = Chatbot.load(model, compilation)
    try:
        bot.check(**decoding)
    except ValueError as error:
        raise UserError(str(error)) from None
    return bot


class ModelOnFirstUse:
    """Loads the model for the first line that needs a reply: piped lines that are all refused (one
    1 MB line) are answered at once, without waiting seconds for TensorFlow."""

    def __init__(self, model: str, decoding: dict):
        self.model, self.decoding, self.bot = model, decoding, None

    def reply(self, text: str, **decoding) -> str:
        if self.bot is None:
            self.bot = load_for_chat(self.model, self.decoding)
        return self.bot.reply(text, **decoding)


def chat_interactively(bot, model, decoding: dict, context: bool = True) -> None:
    """A conversation: each reply reads the messages before it (with `context`, on a model trained on dialogues);
    a line in NEW_CONVERSATION starts a new one, an empty line or Ctrl-D ends."""
    keeps = context and bot.reads_context
    print(f"chatbot ({model}) — 빈 줄이나 Ctrl-D로 끝내요." + (" /new: 새 대화" if keeps else ""))
    history = []
    while True:
        try:
            line = input("나> ")
        except EOFError:
            break
        if not line.strip():
            break
        if line.strip() in NEW_CONVERSATION:
            history = []
            print("(새 대화)", flush=True)
            continue
        try:
            question = check_question(line)
            reply = bot.reply(question, history=history if keeps else None, **decoding)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            continue
        print(f"챗봇> {reply}", flush=True)
        history = [*history, {"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        history = history[-2 * CONTEXT_TURNS:]  # more than the model reads, never the whole session


def answer_lines(bot, lines, decoding: dict) -> None:
    """One reply line per input line (bytes), in order; a blank line stays blank. A line that is not
    UTF-8 or is too long gets an empty reply line and a note on stderr, and the batch goes on; at the
    end, one `error:` line says how many were skipped."""
    skipped = []
    for number, raw in enumerate(lines, start=1):
        try:
            line = raw.decode("utf-8").rstrip("\r\n")
            question = check_question(line) if line.strip() else ""
        except (UnicodeDecodeError, UserError) as error:
            reason = "not UTF-8 text" if isinstance(error, UnicodeDecodeError) else str(error)
            print(f"skipped line {number}: {reason}", file=sys.stderr, flush=True)
            skipped.append((number, reason))
            question = ""
        print(bot.reply(question, **decoding) if question else "", flush=True)  # a model's error ends the batch
    if len(skipped) == 1:  # the error line says why on its own (a lone piped line, like a 1 MB one)
        raise UserError(f"1 line(s) were not answered (line {skipped[0][0]}: {skipped[0][1]})")
    if skipped:
        shown = ", ".join(str(number) for number, _ in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
        raise UserError(f"{len(skipped)} line(s) were not answered (line {shown}; see above)")

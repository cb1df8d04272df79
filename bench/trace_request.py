"""Which project modules one `/chat` request runs through, in order: the reply path's shape, measured.

Starts the app's handlers in this process (`app.ChatApp` over the model, as `app.py` builds them), answers one
request so every graph is traced, then answers a second one under `sys.setprofile` and records every call from
one project module (a `chatbot/` file or `app.py`) into another. Prints those calls, the modules in the order
the request reaches them, and every call back up that order, into a module reached before the caller (the
tokenizer's excepted: several stages call it by design).

    python bench/trace_request.py [--model models/default] [--question 배고파]
"""

import argparse
import sys
import tempfile
from pathlib import Path

from common import ROOT

ALLOWED_RETURNS = {"chatbot/tokenizer/subword.py"}


def project_module(filename: str) -> str | None:
    path = Path(filename)
    try:
        relative = path.resolve().relative_to(ROOT)
    except ValueError:
        return None
    name = relative.as_posix()
    return name if name.startswith("chatbot/") or name == "app.py" else None


def trace(call) -> list[tuple[str, str]]:
    """Every call `call()` makes from one project module into another: (caller, callee), in order. The caller is
    the nearest project frame up the stack (a call through Keras or TensorFlow counts as the project code's)."""
    calls = []

    def profile(frame, event, _arg):
        if event != "call":
            return
        callee = project_module(frame.f_code.co_filename)
        if callee is None:
            return
        caller, up = None, frame.f_back
        while up is not None and caller is None:
            caller, up = project_module(up.f_code.co_filename), up.f_back
        if caller and caller != callee:
            calls.append((caller, callee))

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls


def back_calls(calls: list[tuple[str, str]], first: str) -> list[tuple[str, str]]:
    """The calls that go back up the path: into a module the request reached before the caller (bar
    ALLOWED_RETURNS), each pair once."""
    rank = {first: 0}
    for caller, callee in calls:
        rank.setdefault(caller, len(rank))
        rank.setdefault(callee, len(rank))
    return list(dict.fromkeys((caller, callee) for caller, callee in calls
                              if rank[callee] < rank[caller] and callee not in ALLOWED_RETURNS))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--question", default="배고파")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import app
    from chatbot.config import Compilation
    from chatbot.app.workspace import load_chatbot

    bot = load_chatbot(args.model, Compilation.WARMED, prepare=True)
    ui = app.ChatApp(bot, tempfile.mkdtemp())
    chat = app.typed_chat_function(ui.chat, app.ChatApp.chat.__doc__, app.refused)  # what /chat calls
    first = chat(args.question)  # traces whatever the request needs
    calls = trace(lambda: chat(args.question))
    modules = list(dict.fromkeys(module for call in calls for module in call))
    print(f"reply: {first}")
    print(f"calls between modules: {len(calls)}; distinct: "
          f"{', '.join(f'{a} -> {b}' for a, b in dict.fromkeys(calls))}")
    print(f"modules: {len(modules)}: {', '.join(modules)}")
    again = back_calls(calls, modules[0])
    print(f"calls back up the path (the tokenizer aside): {len(again)}{': ' if again else ''}"
          f"{', '.join(f'{a} -> {b}' for a, b in again)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

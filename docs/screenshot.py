"""The README's picture of the chat page: a model answering a few everyday messages, in headless Chromium.

Serves the Gradio app in this process on a free local port, asks each question as a user would (typing,
Enter), waits until every reply has arrived, and saves the page. Needs Debian's `chromium` and the
`playwright` package (requirements-dev.txt).

    python docs/screenshot.py [--model models/default] [--out docs/chat.png]
"""

import argparse
import socket
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUESTIONS = ("오늘 너무 피곤해", "내일 발표인데 떨려", "주말에 뭐 하지?")
CHROMIUM = "/usr/bin/chromium"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(ROOT / "models" / "default"))
    parser.add_argument("--out", default=str(ROOT / "docs" / "chat.png"))
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import app
    from chatbot.app.workspace import load_chatbot
    from playwright.sync_api import expect, sync_playwright

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    demo = app.build_demo(load_chatbot(args.model), models_root=Path(tempfile.mkdtemp()))
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=port, quiet=True,
                            **app.LAUNCH_OPTIONS)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                                 args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1100, "height": 760}, locale="ko-KR")
            page.set_default_timeout(120_000)
            expect.set_options(timeout=120_000)
            page.goto(url)
            for count, question in enumerate(QUESTIONS, start=1):
                box = page.locator("#question textarea")
                box.fill(question)
                box.press("Enter")
                expect(page.locator('#chat [data-testid="bot"]')).to_have_count(count)
                page.wait_for_timeout(1500)  # the streamed reply's last pieces
            page.screenshot(path=args.out)
            browser.close()
    finally:
        demo.close()
    print(f"saved: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

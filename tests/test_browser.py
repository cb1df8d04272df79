"""The chat page in a real browser: headless Chromium from Debian's `chromium` package, driven with
Playwright (never a downloaded browser). Skipped when /usr/bin/chromium is missing, unless CI is set."""

import os
import shutil
from pathlib import Path

import pytest

from chatbot.app.workspace import load_chatbot
from conftest import launch_app

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_MS = 120_000  # an upper bound for a stuck page, not a speed requirement

pytestmark = pytest.mark.slow

# Records every text the last bot message shows, so the test can see the reply grow token by token.
WATCH_REPLIES = """() => {
  window.seenReplies = [];
  new MutationObserver(() => {
    const bots = document.querySelectorAll('#chat [data-testid="bot"]');
    const text = bots.length ? bots[bots.length - 1].innerText.trim() : "";
    if (text && text !== window.seenReplies[window.seenReplies.length - 1]) window.seenReplies.push(text);
  }).observe(document.body, {subtree: true, childList: true, characterData: true});
}"""


def require_browser():
    reason = None
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} not found (apt-get install -y chromium)"
    else:
        try:
            import playwright.sync_api  # noqa: F401
        except ImportError:
            reason = "the playwright Python package is not installed"
    if reason and os.environ.get("CI"):
        pytest.fail(f"browser test must run in CI: {reason}")
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def url(tmp_path_factory, tiny_model_dir):
    require_browser()
    root = tmp_path_factory.mktemp("browser-models")
    shutil.copytree(tiny_model_dir, root / "tiny")
    demo, local_url = launch_app(load_chatbot(root / "tiny"), root)
    yield local_url
    demo.close()


@pytest.fixture()
def page(url):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, locale="ko-KR")
        page.set_default_timeout(WAIT_MS)
        expect.set_options(timeout=WAIT_MS)  # assertions too (their own default is 5 s)
        page.goto(url)
        yield page
        browser.close()


def screenshot_paths(tmp_path: Path, name: str) -> list[Path]:
    paths = [tmp_path / name]
    if os.environ.get("CHATBOT_SCREENSHOT_DIR"):
        paths.append(Path(os.environ["CHATBOT_SCREENSHOT_DIR"]) / name)
    return paths


def ask(page, question: str) -> None:
    box = page.locator("#question textarea")
    box.fill(question)
    box.press("Enter")


def test_question_gets_a_streamed_reply_shown_as_text(page, url, tmp_path):
    from gradio_client import Client
    from playwright.sync_api import expect

    # greedy, as the page's defaults; plain HTTP, so no certificates to load
    expected = Client(url, verbose=False, ssl_verify=False).predict("배고파", api_name="/chat")
    page.evaluate(WATCH_REPLIES)
    ask(page, "배고파")
    bots = page.locator('#chat [data-testid="bot"]')
    expect(bots.last).to_contain_text("비슷한 질문: 배고파")  # the note that the tiny model copied its answer
    expect(page.locator('#chat [data-testid="user"]').last).to_have_text("배고파")
    seen = page.evaluate("window.seenReplies")
    assert len(seen) >= 2 and seen[-1].startswith(expected), seen  # it grew in steps, not all at once
    assert all(seen[-1].startswith(partial.rstrip()) for partial in seen), seen

    ask(page, "<b>굵게</b> <img src=x>")
    expect(bots).to_have_count(2)
    expect(page.locator('#chat [data-testid="user"]').last).to_have_text("<b>굵게</b> <img src=x>")
    assert page.locator("#chat b, #chat img[src=x]").count() == 0  # markup shown as text, never rendered

    for path in screenshot_paths(tmp_path, "chat.png"):
        path.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 10_000


def test_latex_in_a_message_is_shown_as_text(page):
    """Asked first on a fresh page: a question asked while the previous reply still streams can meet the
    textbox being cleared by that reply's last update."""
    from playwright.sync_api import expect

    latex = r"$$\color{red}{\Huge 크게}$$ $\rule{40em}{40em}$"
    ask(page, latex)
    expect(page.locator('#chat [data-testid="bot"]')).to_have_count(1)
    expect(page.locator('#chat [data-testid="user"]').last).to_have_text(latex)
    assert page.locator("#chat .katex, #chat .katex-display").count() == 0  # LaTeX shown as text, never typeset


def test_a_new_conversation_clicked_while_a_reply_streams_is_not_undone(tmp_path_factory, tiny_model_dir):
    """"새 대화" clicked a moment after a question: the reply still streaming must not come back when it would have
    finished, nor its exchange be read with the next message. The bot is slowed to a token every 0.3 s, so the
    click always lands mid-reply."""
    import time

    from playwright.sync_api import expect, sync_playwright

    require_browser()
    root = tmp_path_factory.mktemp("browser-slow")
    shutil.copytree(tiny_model_dir, root / "tiny")
    bot = load_chatbot(root / "tiny")
    stream = bot.stream
    steps = len(list(stream("배고파")))

    def slow_stream(*args, **kwargs):
        for partial in stream(*args, **kwargs):
            time.sleep(0.3)
            yield partial

    bot.stream = slow_stream
    demo, url = launch_app(bot, root)
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 900}, locale="ko-KR")
            page.set_default_timeout(WAIT_MS)
            page.goto(url)
            ask(page, "배고파")
            expect(page.locator('#chat [data-testid="bot"]')).to_have_count(1, timeout=WAIT_MS)  # streaming
            page.locator("#new-conversation").click()
            time.sleep(0.3 * steps + 2)  # past the slowed reply's end
            assert page.locator('#chat [data-testid="user"], #chat [data-testid="bot"]').count() == 0
            browser.close()
    finally:
        demo.close()

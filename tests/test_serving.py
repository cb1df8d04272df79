"""ReplyBatcher: concurrent requests decoded together, each caller getting its own reply or error.

Every wait here has a deadline, and every thread is a daemon joined with a timeout: a batcher that hangs fails
its test instead of hanging the worker. What a test checks is what the bot was asked to decode, in which
thread, and what each caller got back."""

import threading
import time

import pytest

from chatbot.serving.batcher import ReplyBatcher

QUESTIONS = ["안녕", "오늘 너무 피곤해", "배고파", "주말에 뭐 하지?", "시험 끝났다", "비가 와", "잠이 안 와", "고마워"]
DEADLINE = 60  # seconds; reached only when something hangs


def wait_until(condition, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {DEADLINE} s for {what}")
        time.sleep(0.001)


def queued(batcher) -> int:
    """Requests waiting for a batch: the one private read here, to let requests arrive while a batch is held."""
    return len(batcher._waiting)


class HeldFirstBatch:
    """The tiny bot, whose first `answer` waits until `expected` other requests are queued, so
    what arrives meanwhile must be decoded as later batches (the real decoding, just held). It records the
    questions of every batch and the thread that decoded it."""

    def __init__(self, bot, batcher, expected):
        self.bot, self.batcher, self.expected, self.calls, self.threads = bot, batcher, expected, [], []
        self.leading = threading.Event()  # the first batch is being decoded

    def __getattr__(self, name):
        return getattr(self.bot, name)

    def answer(self, request):
        if not self.calls:
            self.leading.set()
            wait_until(lambda: queued(self.batcher) >= self.expected, f"{self.expected} requests to queue")
        self.calls.append(list(request.texts))
        self.threads.append(threading.current_thread().name)
        return self.bot.answer(request)


def finish(threads) -> None:
    for thread in threads:
        thread.join(timeout=DEADLINE)
    assert not [thread.name for thread in threads if thread.is_alive()], "callers still waiting for their replies"


def ask_all(batcher, bot, requests):
    """Each request (question, options) from its own thread, named request-<i>; returns replies or exceptions,
    in order. The first request leads; the rest arrive, in order, while its batch is held (`HeldFirstBatch`).
    Each request's graph is traced first: a request whose graph is not ready is decoded alone, beside the batches."""
    for question, options in requests:
        try:
            bot.bot.reply("안녕", **options)
        except ValueError:
            pass  # a refused request: it never reaches a graph
    results = [None] * len(requests)

    def ask(i, question, options):
        try:
            results[i] = batcher.reply(bot, question, **options)
        except Exception as error:  # noqa: BLE001 - the test inspects it
            results[i] = error

    threads = [threading.Thread(target=ask, args=(i, q, o), name=f"request-{i}", daemon=True)
               for i, (q, o) in enumerate(requests)]
    threads[0].start()
    wait_until(lambda: bot.leading.is_set() or not threads[0].is_alive(), "the first request to lead")
    for thread in threads[1:]:  # one at a time, so they queue in order (a refused one never queues)
        before = queued(batcher)
        thread.start()
        wait_until(lambda: queued(batcher) > before or not thread.is_alive(), f"{thread.name} to queue")
    finish(threads)
    return results


def answered_alone(batcher, bot, question):
    """`batcher.reply` from a thread of its own, within the deadline: a batcher left busy would never answer."""
    result = []
    thread = threading.Thread(target=lambda: result.append(batcher.reply(bot, question)), daemon=True)
    thread.start()
    finish([thread])
    return result[0]


def test_concurrent_requests_are_decoded_together_with_the_replies_each_would_get_alone(tiny_bot):
    batcher = ReplyBatcher()
    held = HeldFirstBatch(tiny_bot, batcher, expected=len(QUESTIONS) - 1)
    replies = ask_all(batcher, held, [(q, {}) for q in QUESTIONS])
    assert replies == [tiny_bot.reply(q) for q in QUESTIONS]
    assert held.calls == [QUESTIONS[:1], QUESTIONS[1:]]
    assert answered_alone(batcher, tiny_bot, "고마워") == tiny_bot.reply("고마워")  # nothing left holding the lead


def test_different_settings_and_tones_go_to_different_batches(tiny_bot):
    batcher = ReplyBatcher()
    requests = [("안녕", {}), ("배고파", {"strategy": "beam", "num_beams": 3}), ("비가 와", {}),
                ("고마워", {"tone": "sad"}), ("잠이 안 와", {"strategy": "beam", "num_beams": 3})]
    held = HeldFirstBatch(tiny_bot, batcher, expected=len(requests) - 1)
    replies = ask_all(batcher, held, requests)
    assert replies == [tiny_bot.reply(q, **o) for q, o in requests]
    assert held.calls == [["안녕"], ["배고파", "잠이 안 와"], ["비가 와"], ["고마워"]]


def test_a_greedy_seed_does_not_split_a_batch_but_a_sampling_seed_does(tiny_bot):
    batcher = ReplyBatcher()
    requests = [("안녕", {"seed": 1}), ("배고파", {"seed": 2}), ("비가 와", {}),
                ("고마워", {"strategy": "sample", "seed": 3}), ("잠이 안 와", {"strategy": "sample", "seed": 4})]
    held = HeldFirstBatch(tiny_bot, batcher, expected=len(requests) - 1)
    replies = ask_all(batcher, held, requests)
    assert held.calls == [["안녕"], ["배고파", "비가 와"], ["고마워"], ["잠이 안 와"]]
    assert replies[3:] == [tiny_bot.reply(q, **o) for q, o in requests[3:]]


def test_a_refused_request_fails_alone_and_the_batcher_keeps_serving(tiny_bot):
    batcher = ReplyBatcher()
    requests = [("안녕", {}), ("배고파", {"no_repeat_ngram_size": 999}), ("비가 와", {}), ("고마워", {"top_k": -1})]
    held = HeldFirstBatch(tiny_bot, batcher, expected=1)  # the two bad ones never queue
    results = ask_all(batcher, held, requests)
    assert results[0] == tiny_bot.reply("안녕") and results[2] == tiny_bot.reply("비가 와")
    assert isinstance(results[1], ValueError) and "no_repeat_ngram_size" in str(results[1])
    assert isinstance(results[3], ValueError) and "top_k" in str(results[3])
    assert answered_alone(batcher, tiny_bot, "잠이 안 와") == tiny_bot.reply("잠이 안 와")


def test_a_question_that_is_not_valid_text_is_refused_alone_and_its_neighbours_answered(tiny_bot):
    batcher = ReplyBatcher()
    requests = [("오늘 너무 피곤해", {}), ("배고파", {}), ("\ud800", {}), ("비가 와", {}), ("고마워", {})]
    held = HeldFirstBatch(tiny_bot, batcher, expected=3)  # the lone surrogate never queues
    results = ask_all(batcher, held, requests)
    assert isinstance(results[2], ValueError) and "Unicode" in str(results[2])
    good = [i for i in range(len(requests)) if i != 2]
    assert [results[i] for i in good] == [tiny_bot.reply(requests[i][0]) for i in good]


class FailingBatches:
    """The tiny bot, whose batches of more than one question fail: as a batch broken by one request would."""

    def __init__(self, bot):
        self.bot, self.calls = bot, []

    def __getattr__(self, name):
        return getattr(self.bot, name)

    def answer(self, request):
        self.calls.append(list(request.texts))
        if len(request.texts) > 1 or request.texts == ["망가진 질문"]:
            raise RuntimeError("this batch broke")
        return self.bot.answer(request)


def test_a_batch_that_fails_is_answered_request_by_request(tiny_bot):
    batcher = ReplyBatcher()
    failing = FailingBatches(tiny_bot)
    held = HeldFirstBatch(failing, batcher, expected=3)
    results = ask_all(batcher, held, [("안녕", {}), ("배고파", {}), ("망가진 질문", {}), ("비가 와", {})])
    assert results[0] == tiny_bot.reply("안녕") and results[1] == tiny_bot.reply("배고파")
    assert results[3] == tiny_bot.reply("비가 와")
    assert isinstance(results[2], RuntimeError)  # only the request that fails on its own gets the error
    assert ["배고파", "망가진 질문", "비가 와"] in failing.calls


def test_max_batch_size_is_checked_and_kept(tiny_bot):
    with pytest.raises(ValueError, match="max_batch_size"):
        ReplyBatcher(0)
    batcher = ReplyBatcher(max_batch_size=3)
    held = HeldFirstBatch(tiny_bot, batcher, expected=len(QUESTIONS) - 1)
    ask_all(batcher, held, [(q, {}) for q in QUESTIONS])
    assert [len(batch) for batch in held.calls] == [1, 3, 3, 1]


def test_the_leader_returns_once_its_own_batch_is_done_and_a_waiting_caller_leads(tiny_bot):
    """A reply never waits behind batches that arrived after it: the second batch is decoded by the second
    caller's own thread, which leads only once the first caller has its reply."""
    batcher = ReplyBatcher()
    held = HeldFirstBatch(tiny_bot, batcher, expected=1)
    replies = ask_all(batcher, held, [("안녕", {}), ("배고파", {"tone": "sad"})])  # another tone: another batch
    assert replies == [tiny_bot.reply("안녕"), tiny_bot.reply("배고파", tone="sad")]
    assert held.calls == [["안녕"], ["배고파"]]
    assert held.threads == ["request-0", "request-1"]
    assert answered_alone(batcher, tiny_bot, "고마워") == tiny_bot.reply("고마워")


def test_the_default_batch_is_the_largest_that_chatbot_warm_up_compiles():
    """The web app's batches never meet a batch shape its warm-up left for the first request to compile."""
    import inspect

    from chatbot.decoding.chatbot import Chatbot

    assert max(inspect.signature(Chatbot.warm_up).parameters["rows"].default) == ReplyBatcher().max_batch_size


def test_a_request_whose_graph_is_not_traced_never_holds_up_requests_whose_graph_is(tiny_bot):
    """New settings cost seconds of tracing (held here until the ready requests are answered): they are decoded
    beside the batches, not in them, so one client sweeping settings does not slow everyone else."""
    batcher, tracing, release = ReplyBatcher(), threading.Event(), threading.Event()

    class NewSettingsTraceSlowly:
        def __getattr__(self, name):
            return getattr(tiny_bot, name)

        def ready(self, plan):
            return plan.num_beams == 1

        def answer(self, request):
            if request.plan.num_beams > 1:
                tracing.set()
                release.wait(timeout=120)  # as a trace would, until the others are done
            return tiny_bot.answer(request)

    bot, slow_reply = NewSettingsTraceSlowly(), []
    tiny_bot.reply("안녕")  # the default settings' graph is traced
    slow = threading.Thread(target=lambda: slow_reply.append(batcher.reply(bot, "배고파", strategy="beam", num_beams=3)))
    slow.start()
    assert tracing.wait(timeout=60)
    ready = {}
    threads = [threading.Thread(target=lambda q=q: ready.update({q: batcher.reply(bot, q)})) for q in QUESTIONS[:4]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert ready == {q: tiny_bot.reply(q) for q in QUESTIONS[:4]}  # answered while the trace still runs
        assert slow.is_alive() and batcher.alone == 1
    finally:
        release.set()
        slow.join(timeout=60)
    assert slow_reply == [tiny_bot.reply("배고파", strategy="beam", num_beams=3)]


def test_the_decoder_knows_which_settings_are_traced(tiny_bot):
    from chatbot.config import GenerationConfig

    bot = tiny_bot
    new = bot.plan(GenerationConfig(strategy="beam", num_beams=7))  # a beam count no other test asks for
    assert not bot.ready(new)
    bot.reply("안녕", strategy="beam", num_beams=7)
    assert bot.ready(new) and not bot.ready(bot.plan(GenerationConfig(strategy="beam", num_beams=6)))
    # a setting that is a tensor of the plan's function needs no graph of its own
    assert bot.ready(bot.plan(GenerationConfig(strategy="beam", num_beams=7, no_repeat_ngram_size=3)))

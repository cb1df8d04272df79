"""ReplyBatcher: concurrent requests decoded together, each caller getting its own reply or error."""

import threading
import time

import pytest

from chatbot.serving import ReplyBatcher

QUESTIONS = ["안녕", "오늘 너무 피곤해", "배고파", "주말에 뭐 하지?", "시험 끝났다", "비가 와", "잠이 안 와", "고마워"]


class HeldFirstBatch:
    """The tiny bot, whose first `reply_batch` waits until `expected` other requests are queued, so
    what arrives meanwhile must be decoded as later batches (the real decoding, just held)."""

    def __init__(self, bot, batcher, expected):
        self.bot, self.batcher, self.expected, self.calls = bot, batcher, expected, []

    def __getattr__(self, name):
        return getattr(self.bot, name)

    def reply_batch(self, texts, tone=None, **decoding):
        if not self.calls:
            while len(self.batcher._waiting) < self.expected:
                threading.Event().wait(0.005)
        self.calls.append(list(texts))
        return self.bot.reply_batch(texts, tone, **decoding)


def ask_all(batcher, bot, requests):
    """Each request (question, options) from its own thread; returns replies or exceptions, in order. Each
    request's graph is traced first: a request whose graph is not ready is decoded alone, beside the batches."""
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

    threads = [threading.Thread(target=ask, args=(i, q, o)) for i, (q, o) in enumerate(requests)]
    threads[0].start()
    while not batcher.batches:  # the first request leads and has taken its batch; the rest arrive while it decodes
        time.sleep(0.001)
    for thread in threads[1:]:  # one at a time, so they queue in order (a refused one never queues)
        queued = len(batcher._waiting)
        thread.start()
        while len(batcher._waiting) == queued and thread.is_alive():
            time.sleep(0.001)
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_concurrent_requests_are_decoded_together_with_the_replies_each_would_get_alone(tiny_bot):
    batcher = ReplyBatcher()
    held = HeldFirstBatch(tiny_bot, batcher, expected=len(QUESTIONS) - 1)
    replies = ask_all(batcher, held, [(q, {}) for q in QUESTIONS])
    assert replies == [tiny_bot.reply(q) for q in QUESTIONS]
    assert batcher.batches == [1, len(QUESTIONS) - 1]
    assert not batcher._busy and not batcher._waiting


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
    assert batcher.reply(tiny_bot, "잠이 안 와") == tiny_bot.reply("잠이 안 와")


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

    def reply_batch(self, texts, tone=None, **decoding):
        self.calls.append(list(texts))
        if len(texts) > 1 or texts == ["망가진 질문"]:
            raise RuntimeError("this batch broke")
        return self.bot.reply_batch(texts, tone, **decoding)


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
    assert batcher.batches == [1, 3, 3, 1]


def test_the_leader_returns_once_its_own_batch_is_done_and_a_waiting_caller_leads(tiny_bot):
    """A reply never waits behind batches that arrived after it: the second batch is decoded only after
    the first caller got its reply back (by the second caller, who leads then)."""
    batcher, first_returned = ReplyBatcher(), threading.Event()

    class SecondBatchWaits(HeldFirstBatch):
        def reply_batch(self, texts, tone=None, **decoding):
            if self.calls and not first_returned.wait(5):
                raise AssertionError("the first caller is still decoding later batches")
            return super().reply_batch(texts, tone, **decoding)

    bot = SecondBatchWaits(tiny_bot, batcher, expected=1)
    results = {}

    def first():
        results["first"] = batcher.reply(bot, "안녕")
        first_returned.set()

    def second():
        results["second"] = batcher.reply(bot, "배고파")

    leader = threading.Thread(target=first)
    leader.start()
    while not batcher.batches:
        time.sleep(0.001)
    follower = threading.Thread(target=second)
    follower.start()
    leader.join(timeout=60)
    follower.join(timeout=60)
    assert results == {"first": tiny_bot.reply("안녕"), "second": tiny_bot.reply("배고파")}
    assert bot.calls == [["안녕"], ["배고파"]] and batcher.batches == [1, 1]
    assert not batcher._busy and not batcher._waiting


def test_the_default_batch_is_the_largest_that_chatbot_warm_up_compiles():
    """The web app's batches never meet a batch shape its warm-up left for the first request to compile."""
    import inspect

    from chatbot.generate import Chatbot

    assert max(inspect.signature(Chatbot.warm_up).parameters["rows"].default) == ReplyBatcher().max_batch_size


def test_a_request_whose_graph_is_not_traced_never_holds_up_requests_whose_graph_is(tiny_bot):
    """New settings cost seconds of tracing (held here until the ready requests are answered): they are decoded
    beside the batches, not in them, so one client sweeping settings does not slow everyone else."""
    batcher, tracing, release = ReplyBatcher(), threading.Event(), threading.Event()

    class NewSettingsTraceSlowly:
        def __getattr__(self, name):
            return getattr(tiny_bot, name)

        def ready(self, settings):
            return settings.no_repeat_ngram_size == 0

        def reply_batch(self, texts, tone=None, settings=None, **decoding):
            if settings.no_repeat_ngram_size:
                tracing.set()
                release.wait(timeout=120)  # as a trace would, until the others are done
            return tiny_bot.reply_batch(texts, tone, settings=settings, **decoding)

    bot, slow_reply = NewSettingsTraceSlowly(), []
    tiny_bot.reply("안녕")  # the default settings' graph is traced
    slow = threading.Thread(target=lambda: slow_reply.append(batcher.reply(bot, "배고파", no_repeat_ngram_size=3)))
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
    assert slow_reply == [tiny_bot.reply("배고파", no_repeat_ngram_size=3)]


def test_the_decoder_knows_which_settings_are_traced(tiny_model_dir):
    from chatbot.config import GenerationConfig
    from chatbot.generate import Chatbot

    bot = Chatbot.load(tiny_model_dir, jit_compile=False)
    new = GenerationConfig(no_repeat_ngram_size=4)
    assert not bot.ready(new)
    bot.reply("안녕", settings=new)
    assert bot.ready(new) and not bot.ready(GenerationConfig(no_repeat_ngram_size=5))

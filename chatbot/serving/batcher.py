"""Answering concurrent requests together: a small batching queue in front of `Chatbot.reply_batch`.

Owns: `ReplyBatcher`, which lets many threads (the web app's request workers) ask for one reply
each while the model decodes them in batches. No thread of its own: one caller at a time leads,
decoding everything waiting, grouped by model, tone and decoding settings, until its own reply is
done; then it hands the lead to the oldest waiting caller and returns, so no caller's reply waits
behind batches that arrived after it. A request whose settings have no traced graph yet (a new
beam width or `candidates`, seconds of tracing) is decoded in its own thread instead, so it
never holds up the requests whose graph is ready. Each request is checked once, by the model
(`Chatbot.request`), in that request's thread, before it joins a batch, so a question or an option the model
refuses fails only its own caller; a batch decodes the checked requests as they are (`Chatbot.answer`), and
should it still fail, its requests are answered one by one, so one bad request never fails another.
Must not touch Gradio or decide what the user sees.
"""

from __future__ import annotations

import dataclasses
import threading
from concurrent.futures import Future



@dataclasses.dataclass
class _Request:
    bot: object
    checked: object  # the model's checked request (`chatbot.decoding.request.Request`): one question
    reply: Future = dataclasses.field(default_factory=Future)
    wake: threading.Event = dataclasses.field(default_factory=threading.Event)  # reply done, or lead now
    key: tuple = dataclasses.field(init=False)

    def __post_init__(self):
        """Requests with equal keys decode as one batch: the same model, tone, plan and settings. A seed only
        matters to sampling, and only when it was asked for: other requests share a batch whatever their seed."""
        settings = self.checked.settings
        seed = settings.seed if settings.strategy == "sample" else None
        values = tuple((field.name, getattr(settings, field.name)) for field in dataclasses.fields(settings)
                       if field.name != "seed")
        self.key = (id(self.bot), tuple(self.checked.tones), self.checked.plan, values, seed)


class ReplyBatcher:
    """`reply(bot, question, tone=None, **decoding)` from many threads at once, decoded in batches of
    at most `max_batch_size` questions. 16 by default, the largest batch `Chatbot.warm_up` compiles: a
    batch decodes until its longest reply ends and is padded to a bucket of rows, so 50 waiting requests
    are answered sooner as 16 + 16 + 16 + 2 than as 32 + 18 padded to 32 (bench/load_app.py)."""

    def __init__(self, max_batch_size: int = 16):
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.max_batch_size = max_batch_size
        self._lock = threading.Lock()
        self._waiting: list[_Request] = []
        self._busy = False  # a caller leads
        self.batches: list[int] = []  # the size of every batch decoded so far (for tests and benchmarks)
        self.alone = 0  # requests decoded beside the batches, their graph not traced yet

    def reply(self, bot, question: str, tone=None, settings=None, history=None, **decoding) -> str:
        """`bot`'s reply to `question`; `settings`: a `GenerationConfig`, or else `decoding` as keywords;
        `history`: the conversation before it (`Chatbot.in_context`)."""
        # A refused question, history or option fails here, in the caller's thread, before it can join a batch.
        checked = bot.request([question], tone, settings, [history], **decoding)  # one message, as `reply`
        if not bot.ready(checked.plan):
            # A plan whose graph is not traced yet costs seconds of tracing: decoded in this caller's thread,
            # beside the batches, so requests whose graph is ready never wait behind it.
            with self._lock:
                self.alone += 1
            return bot.answer(checked)[0]
        request = _Request(bot, checked)
        with self._lock:
            self._waiting.append(request)
            if not self._busy:
                self._busy = True
                request.wake.set()
        while True:
            request.wake.wait()
            if request.reply.done():
                return request.reply.result()
            request.wake.clear()  # woken to lead
            self._lead(request)

    def _lead(self, leader: _Request) -> None:
        """Decode what is waiting, batch after batch, until the leader's own reply is done; then wake
        the oldest waiting caller to lead, or let the next caller lead if none is waiting."""
        while True:
            with self._lock:
                if leader.reply.done():
                    if self._waiting:
                        self._waiting[0].wake.set()
                    else:
                        self._busy = False
                    return
                batch, rest = [], []
                for request in self._waiting:
                    fits = request.key == self._waiting[0].key and len(batch) < self.max_batch_size
                    (batch if fits else rest).append(request)
                self._waiting = rest
            self._decode(batch)

    def _decode(self, batch: list[_Request]) -> None:
        head = batch[0]
        self.batches.append(len(batch))
        try:
            replies = head.bot.answer(head.checked.joined([r.checked for r in batch]))
        except BaseException as error:  # noqa: BLE001 - raised in the waiting callers' threads, not this one
            if len(batch) > 1 and isinstance(error, Exception):  # one request's fault must not fail the others
                for request in batch:
                    self._decode([request])
                return
            for request in batch:
                request.reply.set_exception(error)
                request.wake.set()
            return
        for request, reply in zip(batch, replies):
            request.reply.set_result(reply)
            request.wake.set()

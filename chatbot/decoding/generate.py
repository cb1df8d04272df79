"""One decoding function per plan: prepare, the loop and postprocess in one graph, compiled once and kept.

    texts, tones, Options  ->  `Preparer` (a plain graph: XLA compiles no string ops)
        ->  the batch padded to a bucket of rows  ->  `Loop` (XLA where the plan says so)
        ->  `Finisher` (tidy, the fallback, detokenizing, the crisis reply)  ->  reply ids and strings

Owns: `Generator` (`generate`, the one call every entry point makes: `Chatbot.reply`, `reply_batch`, the SavedModel
and the rerank fitting's features; `stream_functions`, the same stages a step at a time), `CompiledCache` (the
bounded cache of compiled functions), `Compilation` (eager, graph, xla, or xla once warmed up) and `warm_up`.
Must not validate a request (`Chatbot.request` did) or read a history.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable

import tensorflow as tf

from chatbot.config import Compilation
from chatbot.decoding.loop import Loop
from chatbot.decoding.postprocess import Finisher
from chatbot.decoding.prepare import Prepared, Preparer
from chatbot.decoding.request import OPTIONS_SIGNATURE, Options, Plan
from chatbot.model.inputs import bucket

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # batches are padded to these many rows (XLA shapes)
COMPILED_KEPT = 8  # plans whose compiled functions are kept (the defaults and a few others)


class CompiledCache:
    """`get(key, build)`: the function stored under `key`, built by `build()` on a miss. At most `size` are kept,
    the least recently used dropped first: each holds traced graphs and XLA executables (tens of MB), and the
    plans that key them are valid user options, so an unbounded dictionary would let any caller grow memory."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.size = size
        self._items: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable):
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        function = build()  # tracing happens on the first call, outside the lock
        with self._lock:
            function = self._items.setdefault(key, function)
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)
        return function

    def peek(self, key: Hashable, default=None):
        """The function stored under `key`, without building one or counting it as used."""
        return self._items.get(key, default)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __iter__(self):
        return iter(list(self._items))

    def __len__(self) -> int:
        return len(self._items)


class Generator:
    """The stages of one model and the compiled function of each plan. `first_plan`: under `Compilation.WARMED`,
    the one plain-graph plan traced (the defaults'), which answers until warm-up has compiled them."""

    def __init__(self, prepare: Preparer, loop: Loop, finish: Finisher, compilation: Compilation, first_plan: Plan):
        self.prepare, self.loop, self.finish, self.compilation = prepare, loop, finish, compilation
        self.first_plan, self.length_buckets = first_plan, prepare.length_buckets
        self.warmed: set[Plan] = set()  # plans whose loop `warm_up` compiled with XLA for every shape
        # Keyed by plans a user picks: bounded, so sweeping valid options cannot grow memory.
        self._compiled, self._prepare_graphs = CompiledCache(COMPILED_KEPT), CompiledCache(COMPILED_KEPT)
        self._stream_graphs = CompiledCache(COMPILED_KEPT)

    def replies(self, texts, tones, options: Options, plan: Plan, min_length=0, prepare=None, loop=None):
        """Prepare, the batch padded to a bucket of rows through the loop, then `Finisher`: reply ids
        (batch, max_length) and strings (batch,). `prepare` and `loop`: their compiled functions, when at hand."""
        prepare = prepare or (lambda texts, tones, min_length: self.prepare(texts, tones, plan.candidates, min_length))
        loop = loop or (lambda prepared, options: self.loop(prepared, options, plan))
        prepared = prepare(texts, tones, min_length)
        batch = tf.shape(texts)[0]
        rows = bucket(batch, BATCH_BUCKETS)  # a few batch shapes cover every batch size
        padded = Prepared(*(tf.pad(t, [[0, rows - batch]] + [[0, 0]] * (t.shape.rank - 1)) for t in prepared))
        return self.finish(texts, loop(padded, options)[:batch], prepared.confident)

    def generate(self, texts, tones, options: Options, plan: Plan, min_length: int = 0):
        """Reply ids (batch, max_length) and strings (batch,) through `plan`'s compiled function (op by op when
        `op_by_op(plan)`: for one reply, tracing the loop costs more than running it)."""
        texts, tones = tf.convert_to_tensor(texts, tf.string), tf.convert_to_tensor(tones, tf.int32)
        if self.op_by_op(plan):
            return self.replies(texts, tones, options, plan, tf.constant(min_length))
        return self.compiled(plan)(texts, tones, options, tf.constant(min_length))

    def op_by_op(self, plan: Plan) -> bool:
        """Whether `plan` decodes eagerly: always under EAGER; under WARMED (the app), every plan but the warmed ones
        and the defaults' plain graph. A server's visitors choose the settings, and each new plan traced cost about
        115 MB of the process on the default model and 5-11 s before its first reply; op by op a reply takes
        about a second and traces nothing, so a sweep of settings leaves the server's memory as it was."""
        return self.compilation is Compilation.EAGER or (
            self.compilation is Compilation.WARMED and not plan.jit and plan != self.first_plan)

    def compiled(self, plan: Plan):
        """`plan`'s replies function, built once and kept in a bounded cache: a plain graph holding its prepare (a
        graph shared by every plan with its candidate count, so a new plan traces only its loop) and its loop
        (XLA when `plan.jit`, compiled once per batch and length bucket it meets)."""
        return self._compiled.get(plan, lambda: self._build(plan))

    def _build(self, plan: Plan):
        prepare = self._prepare_graph(plan.candidates)
        retrieved = [None, plan.candidates, self.loop.max_length]
        loop_signature = [Prepared(tf.TensorSpec([None, None], tf.int32), tf.TensorSpec(retrieved, tf.int32),
                                   tf.TensorSpec([None, plan.candidates], tf.float32),
                                   tf.TensorSpec([None], tf.float32)), OPTIONS_SIGNATURE]
        compiled_loop = tf.function(lambda prepared, options: self.loop(prepared, options, plan), jit_compile=plan.jit,
                                    autograph=False, input_signature=loop_signature)

        def replies(texts, tones, options, min_length):
            return self.replies(texts, tones, options, plan, min_length, prepare, compiled_loop)

        return tf.function(replies, autograph=False, input_signature=[
            tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32), OPTIONS_SIGNATURE,
            tf.TensorSpec([], tf.int32)])

    def _prepare_graph(self, candidates: int):
        """`Preparer` for plans with `candidates` (all that it reads of a plan) as one traced graph, shared."""
        return self._prepare_graphs.get(candidates, lambda: tf.function(
            lambda texts, tones, min_length: self.prepare(texts, tones, candidates, min_length), autograph=False,
            input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None], tf.int32),
                             tf.TensorSpec([], tf.int32)]))

    def stream_functions(self, plan: Plan):
        """`begin(texts, tones) -> State` and `step(state, options) -> State`: the loop of `plan` a token at a time,
        from the same `Preparer` and `Loop`. Plain graphs whatever the compilation (op by op where
        `op_by_op(plan)`): a step is milliseconds either way, while an XLA compilation per encoder length would
        keep the first streamed reply waiting."""
        eager = self.op_by_op(plan)
        prepare = (lambda texts, tones, min_length: self.prepare(texts, tones, plan.candidates, min_length)) if eager \
            else self._prepare_graph(plan.candidates)

        def begin(texts, tones):
            ids = prepare(texts, tones, tf.constant(0)).encoder_ids
            return self.loop.start(ids, self.loop.encode(ids), plan)

        def step(state, options):
            return self.loop.step(state, options, plan)

        if eager:
            return begin, step
        return self._stream_graphs.get(Plan(plan.strategy, plan.num_beams, plan.candidates), lambda: (
            tf.function(begin, autograph=False), tf.function(step, autograph=False)))

    @property
    def compiled_plans(self) -> list[Plan]:
        """The plans whose compiled functions are kept, least recently used first."""
        return list(self._compiled)

    def ready(self, plan: Plan) -> bool:
        """Whether a reply with `plan` runs at once, with no graph to trace first: a request whose plan is not
        ready would make a batch wait seconds for the trace."""
        function = self._compiled.peek(plan)
        return self.compilation is Compilation.EAGER or (
            function is not None and function.experimental_get_tracing_count() > 0)

    def warm_up(self, options: Options, plan: Plan, rows=BATCH_BUCKETS[:5]) -> None:
        """Compile everything `plan` needs, for batches of `rows` and every encoder length, through the replies
        function as requests call it (XLA shares no compilation between a function alone and inside a graph).
        Under `Compilation.WARMED`, requests with this plan use XLA only from then on: none waits for it."""
        for length in self.length_buckets:
            for count in rows:
                self.generate(["안녕"] * count, [-1] * count, options, plan, min_length=length)
        self.warmed.add(plan)

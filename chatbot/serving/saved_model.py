"""Export: a TensorFlow SavedModel that maps question strings to reply strings.

Owns: the `tf.Module` whose `serving_default` signature runs normalisation, SentencePiece
tokenisation, retrieval of the nearest training answers, cached greedy decoding, the reply weighed
against the retrieved answers (`candidates`, as `Chatbot.reply` by default) and detokenisation inside
the graph (`serve_with_tone` the same with a tone per question, and `serve_with_history` with the
conversation before each question as well), so the SavedModel
answers in a process that imports only `tensorflow` and `tensorflow_text` (and serves under
TensorFlow Serving). A reply is tidied as `Chatbot.reply` tidies it (the engine's `tidy`, in the same reply
graph: a stutter said once, a repeated phrase or a runaway loop cut), and a
message that may signal a crisis gets `chatbot.safety.keywords`'s reply (the list, then, with e5 loaded, `chatbot.safety.meaning`'s
classifier), both in the graph. Must not depend on
Python-side tokenization.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import tensorflow as tf

from chatbot.artifacts import EXPORT_MARKER, recover_model_dir, replace_dir
from chatbot.files import temp_path_beside
from chatbot.config import __version__
from chatbot.safety.meaning import REPLIES as CRISIS_REPLIES
from chatbot.decoding.engine import Chatbot, Compilation
from chatbot.model.inputs import in_window
from chatbot.safety.keywords import ABUSE_PATTERN, ABUSE_REPLY, NOT_COMPACT, SELF_HARM_PATTERN, SELF_HARM_REPLY
from chatbot.data.text import CONTEXT_CHARS, TURN
from chatbot.tokenizer.subword import normalize_tf, question_part_tf


class ReplyModule(tf.Module):
    """`serve(questions: string[batch]) -> {"replies": string[batch]}` with `Chatbot.reply`'s default
    decoding (the model's own reply, as the compiled loop writes it), and
    `serve_with_tone(questions, tones: int32[batch])` (0 everyday, 1 sad, 2 love, -1 none), and
    `serve_with_history(questions, history: string[batch, messages], tones)`: each question's earlier messages,
    oldest first, "" where a row has fewer (a model trained on dialogues reads the last ones)."""

    def __init__(self, bot: Chatbot):
        super().__init__(name="chatbot")
        self.model = bot.model
        self.sentencepiece = bot.tokenizer.sp  # tracked, so the vocabulary travels with the SavedModel
        self.retriever = bot.retriever  # and the retrieval index (its table and variables), if any
        self._bot = bot
        self.crisis_head = bot.crisis_head  # tracked: its weights travel with the SavedModel (None without e5)
        settings = bot.check(max_new_tokens=bot.model.max_length, seed=0)
        self._options, self._plan = bot.options(settings), bot.plan(settings, jit=True)
        self._turns = bot.config.context.turns

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="questions")], autograph=False)
    def serve(self, questions):
        return self.serve_with_tone(questions, tf.fill(tf.shape(questions), -1))

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="questions"),
                                  tf.TensorSpec([None], tf.int32, name="tones")], autograph=False)
    def serve_with_tone(self, questions, tones):
        return self._replies(one_message_graph(questions), tones)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="questions"),
                                  tf.TensorSpec([None, None], tf.string, name="history"),
                                  tf.TensorSpec([None], tf.int32, name="tones")], autograph=False)
    def serve_with_history(self, questions, history, tones):
        return self._replies(with_context_graph(one_message_graph(questions), history, self._turns), tones)

    def _replies(self, texts, tones):
        """Each text (a message, with its conversation joined by `TURN`) -> its reply, the crisis reply included."""
        _, replies = self._bot.generate(texts, tones, self._options, self._plan)  # the cut and the fallback included
        messages = question_part_tf(texts)
        classes = None
        if self.crisis_head is not None:  # e5 loaded: the classifier by meaning, after the list (`chatbot.safety.meaning`)
            classes = self.crisis_head.classes(self.retriever.pretrained.message_vectors(normalize_tf(messages)))
        return {"replies": crisis_replies_graph(messages, replies, classes)}


def one_message_graph(questions: tf.Tensor) -> tf.Tensor:
    """`chatbot.data.text.one_message` in the graph: a `TURN` typed inside a question becomes a space."""
    return tf.strings.regex_replace(questions, TURN, " ")


def with_context_graph(questions: tf.Tensor, history: tf.Tensor, turns: int) -> tf.Tensor:
    """`chatbot.data.text.with_context` in the graph: each question (batch,) and the last `turns` non-empty messages of
    its history (batch, messages; oldest first), newest first, cleaned, each its last CONTEXT_CHARS characters,
    separated by `TURN`."""
    if not turns:
        return questions
    messages = normalize_tf(history)
    messages = tf.ragged.boolean_mask(messages, messages != "")
    chars = tf.strings.length(messages.flat_values, unit="UTF8_CHAR")
    start = tf.maximum(chars - CONTEXT_CHARS, 0)
    messages = messages.with_flat_values(tf.strings.substr(messages.flat_values, start, chars - start,
                                                           unit="UTF8_CHAR"))
    lengths = messages.row_lengths()
    earlier = tf.reverse(in_window(messages, lengths - turns, lengths), axis=[1])
    joined = tf.strings.reduce_join(tf.concat([normalize_tf(questions)[:, None], earlier], axis=1), axis=1,
                                    separator=TURN)
    return tf.where(lengths > 0, joined, questions)


def crisis_replies_graph(questions: tf.Tensor, replies: tf.Tensor, classes: tf.Tensor | None = None) -> tf.Tensor:
    """`Chatbot.postprocess`'s crisis replies in the graph: the same patterns (`chatbot.safety.keywords`) on the same
    compacted text, then, where they match nothing, the classifier's `classes` (batch,) of the same messages
    (`chatbot.safety.meaning`: 0 none, 1 self-harm, 2 abuse), if the model has e5 loaded."""
    compact = tf.strings.regex_replace(normalize_tf(questions), NOT_COMPACT, "")
    self_harm = tf.strings.regex_full_match(compact, f".*(?:{SELF_HARM_PATTERN}).*")
    abuse = tf.strings.regex_full_match(compact, f".*(?:{ABUSE_PATTERN}).*")
    if classes is not None:
        for kind, reply in CRISIS_REPLIES.items():
            replies = tf.where(classes == kind, reply, replies)
    return tf.where(self_harm, SELF_HARM_REPLY, tf.where(abuse, ABUSE_REPLY, replies))


def export_saved_model(model_dir: str | Path, out_dir: str | Path, overwrite: bool = False,
                       crisis_by_meaning: bool = False) -> Path:
    """Write the SavedModel to a temporary sibling, then swap it into place (`artifacts.replace_dir`): an
    existing export is replaced only once the new one is complete. The CLI checks first that `out_dir` may be
    replaced at all (`artifacts.check_replaceable`). `crisis_by_meaning`: as `Chatbot`'s (off by default)."""
    out_dir = Path(out_dir)
    module = ReplyModule(Chatbot.load(model_dir, Compilation.XLA, crisis_by_meaning))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    recover_model_dir(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} already exists")
    temp = temp_path_beside(out_dir)
    try:
        tf.saved_model.save(module, str(temp), signatures={"serving_default": module.serve,
                                                           "serve_with_tone": module.serve_with_tone,
                                                           "serve_with_history": module.serve_with_history})
        (temp / EXPORT_MARKER).write_text(json.dumps({"written_by": "chatbot export", "version": __version__,
                                                      "model": str(model_dir)}, ensure_ascii=False), encoding="utf-8")
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
    return replace_dir(temp, out_dir)

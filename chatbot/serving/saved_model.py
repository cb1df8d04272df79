"""Export: a TensorFlow SavedModel that maps question strings to reply strings.

Owns: the `tf.Module` whose `serving_default` signature runs normalisation, SentencePiece
tokenisation, retrieval of the nearest training answers, cached greedy decoding, the reply weighed
against the retrieved answers (`candidates`, as `Chatbot.reply` by default) and detokenisation inside
the graph (`serve_with_tone` the same with a tone per question, and `serve_with_history` with the
conversation before each question as well), so the SavedModel
answers in a process that imports only `tensorflow` and `tensorflow_text` (and serves under
TensorFlow Serving). Each signature runs the plan's one decoding function, `Chatbot.reply`'s
(`chatbot.decoding.generate`): a reply tidied, the fallback, and a message that may signal a crisis given
`chatbot.safety.keywords`'s reply (the list, then, with e5 loaded and asked for, `chatbot.safety.meaning`'s
classifier), all in the graph. Must not depend on
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
from chatbot.decoding.chatbot import Chatbot
from chatbot.config import Compilation
from chatbot.data.text_tf import one_message_tf, with_context_tf


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
        return self._replies(one_message_tf(questions), tones)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="questions"),
                                  tf.TensorSpec([None, None], tf.string, name="history"),
                                  tf.TensorSpec([None], tf.int32, name="tones")], autograph=False)
    def serve_with_history(self, questions, history, tones):
        return self._replies(with_context_tf(questions, history, self._turns), tones)

    def _replies(self, texts, tones):
        """Each text (a message, with its conversation joined by `TURN`) -> its reply: the plan's one decoding
        function, `Chatbot.reply`'s (tidy, the fallback and the crisis reply included)."""
        return {"replies": self._bot.generator.generate(texts, tones, self._options, self._plan)[1]}


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

"""A model whose every next-token choice the test writes down, for checks that a decoding setting changes a reply.

The tiny session model gives each training question its memorised answer with near certainty, so no decoding
setting can move it. `ToyModel` stands in for `chatbot.model.transformer.Transformer` where the decoding loop drives it
(`encode`, `cross_cache`, `empty_cache`, `decode_step`, `decode`): the next token's logits are the row of a
table chosen by the last token written, one table for each tone token the encoder input may hold (or none).
Everything else (processing the logits, the samplers, beam ranking, rescoring, tones, detokenizing) is the
product's own code.
"""

import numpy as np
import tensorflow as tf

from chatbot.tokenizer.subword import END_ID, START_ID, TONE_IDS

LOW = -8.0  # the logit of every token a row does not name


class ToyModel:
    def __init__(self, vocab_size: int, max_length: int = 8):
        self.vocab_size, self.max_length, self.encoder_length = vocab_size, max_length, max_length
        self.table = np.full((1 + len(TONE_IDS), vocab_size, vocab_size), LOW, np.float32)  # (tone, last, next)

    def follows(self, last: int, logits: dict, tone: int | None = None) -> "ToyModel":
        """After `last`, the next token's logits are `logits` ({token: logit}, the rest LOW); `tone` (0-2): only
        in a question asked in that tone (None: in every tone, and in none)."""
        for layer in range(len(self.table)) if tone is None else [1 + tone]:
            self.table[layer, last] = LOW
            for token, logit in logits.items():
                self.table[layer, last, token] = logit
        return self

    def says(self, ids, tone: int | None = None) -> "ToyModel":
        """The reply `ids` (then END) with near certainty; `tone` as in `follows`. A token may come once only."""
        if len(set(ids)) < len(ids):
            raise ValueError(f"a token comes twice in {ids}: the table cannot say what follows it")
        ids = [START_ID, *ids, END_ID]
        for last, token in zip(ids, ids[1:]):
            self.follows(last, {token: 10.0}, tone)
        return self

    # -- what the decoding loop calls --

    def encode(self, encoder_ids, training=False):
        # The memory is the tone asked (0: none, 1 + tone), so that the cross "cache" carries it to every step.
        tones = tf.constant(TONE_IDS, encoder_ids.dtype)
        asked = tf.reduce_max(tf.where(encoder_ids[:, :, None] == tones, tf.range(1, len(TONE_IDS) + 1), 0), axis=[1, 2])
        return tf.cast(asked, tf.int32)

    def cross_cache(self, memory):
        return memory

    def empty_cache(self, rows):
        return tf.zeros([rows, 1])

    def decode_step(self, token_ids, index, self_cache, cross_cache, encoder_ids, before=None):
        return tf.gather_nd(tf.constant(self.table), tf.stack([cross_cache, token_ids[:, 0]], axis=-1)), self_cache

    def decode(self, decoder_inputs, memory, encoder_ids, training=False, cross_cache=None):
        return tf.gather(tf.constant(self.table[0]), decoder_inputs)  # teacher-forced, for reranking


PLAIN_REPLY, SAD_REPLY = "반가워요.", "힘들겠어요."  # no piece comes twice in either, as `says` needs


def toned_chatbot(tokenizer, learned_tones: bool = True):
    """A `Chatbot` (a plain graph) over a `ToyModel` that answers every question with PLAIN_REPLY, and with
    SAD_REPLY when the encoder input holds the sad tone token; `learned_tones`: what its config says."""
    from chatbot.config import ChatbotConfig, ContextConfig, ModelConfig
    from chatbot.decoding.chatbot import Chatbot

    plain, sad = tokenizer.encode([PLAIN_REPLY, SAD_REPLY])
    model = ToyModel(tokenizer.vocab_size, max_length=16).says(plain).says(sad, tone=1)
    config = ChatbotConfig(model=ModelConfig(vocab_size=tokenizer.vocab_size, max_length=16),
                           context=ContextConfig(retrieved=0, tone=learned_tones))
    return Chatbot(model, tokenizer, config, compilation="graph")

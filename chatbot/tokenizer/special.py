"""The reserved token ids: what every vocabulary starts with, read by the tokenizer, the pipeline and the model.

Owns: pad, start, end and unknown, then the separator and the tone tokens SentencePiece reserves as
user-defined symbols right after them, and `NUM_SPECIAL`, below which no id ever appears in a reply.
Must not import TensorFlow: the network's modules read these on any Keras backend.
"""

PAD_ID, START_ID, END_ID, UNK_ID = 0, 1, 2, 3
SEPARATOR = "<sep>"  # reserved for retrieval context on the encoder input
TONE_TOKENS = ("<tone0>", "<tone1>", "<tone2>")  # reserved for label conditioning
RESERVED_TOKENS = (SEPARATOR, *TONE_TOKENS)
NUM_SPECIAL = 4 + len(RESERVED_TOKENS)  # ids below this never appear in replies
SEPARATOR_ID = 4  # SentencePiece numbers user-defined symbols right after the four above
TONE_IDS = (5, 6, 7)

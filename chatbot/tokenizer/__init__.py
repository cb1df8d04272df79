"""The subword tokenizer (SentencePiece run as tensorflow-text ops) and the reserved token ids."""

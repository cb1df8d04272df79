"""The networks: the encoder-decoder transformer and its layers, what its encoder reads, the model's own sentence
encoder and the pretrained one (multilingual-e5-small). Keras only where it is a network."""

"""The demo and its pieces: the testbed models, their tokenizer and engine settings."""

"""specctl: an adaptive controller for speculative decoding in vLLM."""

__version__ = "0.1.0"

"""buun: a one-command DFlash speculative-decoding server for Qwen3.5-27B on llama.cpp."""

__version__ = "0.1.0"

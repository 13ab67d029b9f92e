"""spec-tuner: measure and tune speculative decoding for vLLM."""

__version__ = "0.1.0"

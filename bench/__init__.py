"""bench: measure distributed LLM training strategies on one model and one data stream."""
__version__ = "0.1.0"

"""prefixlab: simulate, compare and deploy cache policies for LLM serving."""

__version__ = "0.1.0"

"""PT2E quantization for the C7x: the quantizer and its factory."""

from .quantizer import C7xMMAQuantizer

__all__ = ["C7xMMAQuantizer"]

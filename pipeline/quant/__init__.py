"""PT2E quantization for the C7x: :class:`C7xMMAQuantizer` (``quantizer``), its specs
(``specs``) and its per-op annotation rules (``rules``)."""

from .quantizer import C7xMMAQuantizer

__all__ = ["C7xMMAQuantizer"]

"""PT2E quantization for the C7x: :class:`C7xMMAQuantizer` (``quantizer``), its specs
(``specs``) and its per-op annotation rules (``rules``).

The quantizer is imported on first use (PEP 562), so reading the recipe search's candidates
(:mod:`pipeline.quant.search`, needed when the entries are loaded) imports no torch."""

__all__ = ["C7xMMAQuantizer"]


def __getattr__(name: str):
    if name == "C7xMMAQuantizer":
        from .quantizer import C7xMMAQuantizer
        return C7xMMAQuantizer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

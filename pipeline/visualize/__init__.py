"""The offload page (``visualize`` stage): one self-contained ``offload.html`` per model.

- :mod:`.graph`: the graph of one build from its ``manifest.json`` (a node per
  kernel call plus input and output, an edge per tensor, labels, colours).
- :mod:`.readers`: the optional ``profile.json`` and ``layers.json``, read
  into the page's shape.
- :mod:`.page`: the page data and the HTML (``template.html``, ``page.css``,
  ``page.js`` and the vendored dagre layout library, all inlined).

Plain Python: no torch, no tvm, no doit.
"""

from .page import offload_page, page_data, render

__all__ = ["offload_page", "page_data", "render"]

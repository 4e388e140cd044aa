"""Stage ``visualize``: the manifests of every build -> ``offload.html``.

One self-contained page (no network, opens from ``file://``): the offload
graph of each build, a sortable layer table, the details of a layer on
click, and, when the files are there, a profile tab (``profile.json``) and a
numerics tab (``layers.json``), and the C7x estimate (``estimate.json``) on the nodes, in the
details, the sidebar and the profile tab, the held-out fidelity (``holdout.json``) and the recipe search's trade-off (``search.json``)
in the sidebar. The page is built by :mod:`pipeline.visualize`;
this function only reads and writes files. No torch, no tvm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..data.fidelity import holdout_lines
from ..fsutil import write_text
from ..visualize import offload_page
from ..visualize.readers import read_estimate, read_numerics, read_profile, read_search


def visualize_model(model: str, manifests: dict[str, Path], out: Path, profile: Path | None = None,
                    numerics: Path | None = None, detections: Path | None = None,
                    estimate: Path | None = None, fidelity: Path | None = None,
                    search: Path | None = None) -> dict:
    """Write ``out`` (offload.html) from ``manifests`` (variant -> manifest.json, page order).

    ``profile`` / ``numerics`` / ``estimate``: ``profile.json`` / ``layers.json`` /
    ``estimate.json``, used when the file exists (the page works without them); ``fidelity``: the
    ``holdout.json`` whose lines the sidebar shows (:func:`pipeline.data.fidelity.holdout_lines`). ``detections``: a
    detection model's ``detections/index.html`` (verify's pictures), linked
    from the title. ``search``: the ``search.json`` of an entry with ``[quantizer] target``,
    plotted in the sidebar (:func:`pipeline.visualize.readers.read_search`). Returns the
    page's size and what it shows.
    """
    parsed = {v: json.loads(Path(p).read_text()) for v, p in manifests.items()}
    prof, nums, est = read_profile(profile), read_numerics(numerics), read_estimate(estimate)
    links = {"detections": Path(os.path.relpath(detections, Path(out).parent)).as_posix()} if detections else None
    lines = holdout_lines(json.loads(Path(fidelity).read_text())) if fidelity and Path(fidelity).is_file() else []
    found = read_search(search)
    text = offload_page(model, parsed, prof, nums, links, est, lines, found)
    write_text(out, text)
    return {"bytes": len(text.encode("utf-8")), "builds": list(parsed),
            "profile": prof is not None, "numerics": nums is not None, "estimate": est is not None,
            "fidelity": bool(lines), "search": found is not None}

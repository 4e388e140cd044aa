"""Find a model's checkpoint file, following torch hub conventions.

No torch import here: the lookup runs when the task list is loaded.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from .config import ModelSpec
from .errors import WeightsNotFoundError
from .fsutil import sha256_file


def torch_hub_checkpoints() -> Path:
    """``$TORCH_HOME/hub/checkpoints`` (torch's default ``~/.cache/torch``)."""
    home = os.environ.get("TORCH_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "torch")
    return Path(home) / "hub" / "checkpoints"


def candidate_paths(spec: ModelSpec, root: Path) -> list[Path]:
    """Every place looked at, in order: explicit path, torch hub cache, registry package."""
    w = spec.weights
    out = []
    if w.path:
        p = Path(os.path.expanduser(w.path))
        out.append(p if p.is_absolute() else root / p)
    if w.file:
        out.append(torch_hub_checkpoints() / w.file)
    if w.package and w.package_path:
        found = importlib.util.find_spec(w.package)  # locates without importing it
        if found is not None and found.submodule_search_locations:
            out.append(Path(list(found.submodule_search_locations)[0]) / w.package_path)
    return out


def resolve_weights(spec: ModelSpec, root: Path) -> Path | None:
    """First existing checkpoint path for ``spec``, or None (random-init models too)."""
    if not spec.weights.pretrained:
        return None
    for p in candidate_paths(spec, root):
        if p.is_file():
            return p
    raise WeightsNotFoundError(missing_weights_message(spec, root))


def missing_weights_message(spec: ModelSpec, root: Path) -> str:
    """One line naming the model, every place looked at, and what to do."""
    w = spec.weights
    looked = ", ".join(str(p) for p in candidate_paths(spec, root)) or "nowhere (no file/path given)"
    fix = [f"put {w.file} in {torch_hub_checkpoints()}" if w.file else None,
           w.install_hint,
           f"or fix weights.path in {spec.source}" if w.path else f"or set weights.path in {spec.source}"]
    return (f"model {spec.name!r}: weights not found (looked in {looked}); "
            + "; ".join(f for f in fix if f))


def check_weights_hash(spec: ModelSpec, path: Path) -> str:
    """Check torchvision's sha256 prefix in the loaded file's name against its content.

    The prefix comes from the name of the file actually loaded (an explicit
    ``path`` named ``mine.pth`` is not checked). Returns the sha256. Raises
    :class:`WeightsNotFoundError` on a mismatch (a truncated download or a
    different checkpoint under a torchvision name).
    """
    digest = sha256_file(path)
    m = re.search(r"-([0-9a-f]{8,64})\.pth?$", path.name)
    if m and not digest.startswith(m.group(1)):
        raise WeightsNotFoundError(
            f"model {spec.name!r}: {path} has sha256 {digest[:12]}..., but its name promises prefix "
            f"{m.group(1)}: the file is corrupt or a different checkpoint (re-download it, or rename "
            f"your own checkpoint so its name carries no torchvision hash)")
    return digest

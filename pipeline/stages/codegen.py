"""Stage ``codegen``: Relax module -> static C + weights.bin + offload manifest.

One build per variant: "mmalib" (eligible layers on MMALIB/C7x kernels) when
the model enables it, and always "scalar" (everything on TVM's scalar path),
the baseline the verify stage compares against.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from pathlib import Path

from ..config import ModelSpec
from ..errors import ConfigError
from ..fsutil import atomic_dir


def _remove_other_variants(out_dirs: dict[str, Path]) -> None:
    """Delete builds of variants no longer configured (e.g. c/mmalib after mmalib = false)."""
    import shutil
    keep = {Path(p).name for p in out_dirs.values()}
    for parent in {Path(p).parent for p in out_dirs.values()}:
        for d in parent.iterdir() if parent.is_dir() else []:
            if d.is_dir() and d.name not in keep and not d.name.startswith("."):
                shutil.rmtree(d)


def memory_budget(spec: ModelSpec):
    """The L2 SRAM and MSMC sizes of the entry's ``[target]`` (:class:`~pipeline.backend.levels.Budget`)
    for the staged memory plan; None for ``[codegen] memory = "flat"``. ConfigError: one line."""
    if spec.codegen.memory == "flat":
        return None
    from ..backend.levels import Budget
    from ..target import spec_target

    t = spec_target(spec)
    return Budget(l2=int(t.l2_sram_bytes), msmc=int(t.msmc_bytes))


@contextlib.contextmanager
def _l2_checked(spec: ModelSpec):
    """Turn the memory plan's L2TooSmall into a one-line ConfigError naming the entry and the fix."""
    from ..backend.levels import L2TooSmall

    try:
        yield
    except L2TooSmall as e:
        raise ConfigError(f"codegen {spec.name} ({spec.source}): {e}; raise [target] l2_sram_bytes to at "
                          f"least {e.needs}, or set [codegen] memory = \"flat\"") from None


def codegen_model(spec: ModelSpec, script: Path, params: Path, out_dirs: dict[str, Path],
                  layers: Path | None = None) -> dict:
    """Compile ``relax/module.py`` + ``params.bin`` once per variant into ``out_dirs``,
    with the memory plan of ``[codegen] memory`` (:func:`memory_budget`).

    ``layers``: ``relax/layers.json`` (binding -> PyTorch module path, source
    line, layer id) for the manifest. Returns {variant: compile summary}.
    Each folder is replaced atomically. Raises ConfigError (one line) when the
    ``[target]`` L2 cannot hold the smallest tile of a layer (:class:`~pipeline.backend.levels.L2TooSmall`).
    """
    from ..backend.compile import compile_model
    from ..frontend.irmodule_io import load_irmodule

    mod = load_irmodule(script, params)
    provenance = json.loads(Path(layers).read_text()) if layers else None
    budget = memory_budget(spec)
    _remove_other_variants(out_dirs)
    summaries = {}
    for variant, out in out_dirs.items():
        with atomic_dir(out) as tmp, _l2_checked(spec):
            summaries[variant] = compile_model(mod, spec.name, tmp, mmalib=(variant == "mmalib"),
                                               weights_format=spec.codegen.weights_format,
                                               preprocess=dataclasses.asdict(spec.preprocess),
                                               provenance=provenance, memory=spec.codegen.memory,
                                               budget=budget)
    return summaries

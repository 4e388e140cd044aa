"""SoC descriptions as data: ``pipeline/target/<name>.toml``.

The lowest layer above the core: the memory plan (``backend/levels.py``), the
performance model (``perf/``) and the mixed-precision budget all read it.

A model entry selects one with ``[target] name = "am67a"`` (the default) and
may override any figure in the same table (``l2_sram_bytes = 229376``): public
sources disagree on several AM67A figures, so each is a parameter.
``docs/targets.md`` gives the source of every figure; a target file lists
the figures that are ``assumed`` (not published for that chip) or
``conflicting`` (sources disagree; the chosen value and the others are in
the doc). Loading imports neither torch nor tvm.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

TARGETS_DIR = Path(__file__).resolve().parent
DATA_FILES = ("*.toml",)  # the target tables (code_deps.py)
DEFAULT_TARGET = "am67a"

#: every figure a target file must give: name -> (unit, meaning)
FIGURES: dict[str, tuple[str, str]] = {
    "clock_hz": ("Hz", "C7x clock"),
    "cores": ("count", "C7x+MMA cores (the estimate is for one)"),
    "mma_int8_macs_per_cycle": ("MAC/cycle", "MMA peak, int8 operands"),
    "mma_int16_macs_per_cycle": ("MAC/cycle", "MMA peak, int16 operands"),
    "vector_bits": ("bits", "C7x vector width"),
    "l1d_bytes": ("bytes", "L1D cache"),
    "l2_sram_bytes": ("bytes", "L2 SRAM of one core"),
    "msmc_bytes": ("bytes", "MSMC / L3 SRAM usable by the core (0: none)"),
    "ddr_bytes_per_second": ("bytes/s", "DDR bandwidth"),
    "dma_bytes_per_cycle": ("bytes/cycle", "DMA (DRU) transfer rate"),
    "l2_bytes_per_cycle": ("bytes/cycle", "kernel reads/writes of L2 SRAM"),
    "msmc_bytes_per_cycle": ("bytes/cycle", "kernel reads/writes of MSMC"),
    "mmalib_call_cycles": ("cycles", "fixed cost of one MMALIB call"),
    "c7x_call_cycles": ("cycles", "fixed cost of one C7x vector-kernel call"),
    "tvm_call_cycles": ("cycles", "fixed cost of one TVM scalar-function call"),
}


@dataclass(frozen=True)
class Target:
    """One SoC's figures (:data:`FIGURES`, units there), from its file and the
    entry's overrides. ``overridden``: the figures the model entry changed."""

    name: str
    description: str
    source: str
    figures: dict
    assumed: tuple[str, ...] = ()
    conflicting: tuple[str, ...] = ()
    overridden: tuple[str, ...] = ()

    def __getattr__(self, key: str):
        figures = object.__getattribute__(self, "figures")
        if key in figures:
            return figures[key]
        raise AttributeError(key)

    @property
    def ddr_bytes_per_cycle(self) -> float:
        """DDR bandwidth in bytes per C7x cycle."""
        return self.ddr_bytes_per_second / self.clock_hz

    def mma_macs_per_cycle(self, dtype: str) -> int:
        """MMA peak for ``dtype`` ("int8" / "int16") operands."""
        return self.mma_int16_macs_per_cycle if dtype == "int16" else self.mma_int8_macs_per_cycle

    def lanes(self, dtype: str) -> int:
        """Vector lanes of ``dtype`` elements (256-bit: 32 int8, 16 int16)."""
        bits = {"int8": 8, "uint8": 8, "int16": 16, "int32": 32, "float32": 32}.get(dtype, 32)
        return max(self.vector_bits // bits, 1)

    def to_json(self) -> dict:
        """The figures with their status, as written to estimate.json."""
        status = {k: ("overridden in the model entry" if k in self.overridden else
                      "conflicting sources, value chosen" if k in self.conflicting else
                      "assumed" if k in self.assumed else "published") for k in self.figures}
        return {"name": self.name, "description": self.description, "file": self.source,
                "figures": dict(self.figures), "status": status, "sources": "docs/targets.md"}


def known_targets() -> list[str]:
    """Names of the target files, sorted."""
    return sorted(p.stem for p in TARGETS_DIR.glob("*.toml"))


def target_file(name: str) -> Path:
    """The file of target ``name``; raises ConfigError (one line listing the known targets)."""
    path = TARGETS_DIR / f"{name}.toml"
    if not isinstance(name, str) or "/" in name or not path.is_file():
        raise ConfigError(f"unknown target {name!r} (known: {', '.join(known_targets())})")
    return path


def _number(path, key, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"{path}: figure {key} must be a number >= 0, got {value!r}")
    return value


def load_target(name: str = DEFAULT_TARGET, overrides: dict | None = None, where: str = "") -> Target:
    """Target ``name`` with ``overrides`` (figure -> value) applied.

    Raises ConfigError with one line: an unknown name (listing the known
    targets), a file missing a figure (naming it and the file), an unknown
    figure in the file or in ``overrides`` (``where`` names the model entry),
    a value that is not a number >= 0.
    """
    path = target_file(name)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    figures = data.get("figures", {})
    missing = [k for k in FIGURES if k not in figures]
    if missing:
        raise ConfigError(f"{path}: target {name!r} is missing figure {missing[0]} "
                          f"({FIGURES[missing[0]][1]}, {FIGURES[missing[0]][0]})")
    extra = [k for k in figures if k not in FIGURES]
    if extra:
        raise ConfigError(f"{path}: unknown figure {extra[0]!r} (known: {', '.join(FIGURES)})")
    figures = {k: _number(path, k, figures[k]) for k in FIGURES}
    overrides = dict(overrides or {})
    for k, v in overrides.items():
        if k not in FIGURES:
            raise ConfigError(f"{where or 'model entry'}: [target] has no figure {k!r} "
                              f"(known: name, {', '.join(FIGURES)})")
        figures[k] = _number(where or "model entry", f"target.{k}", v)
    for k in ("clock_hz", "mma_int8_macs_per_cycle", "mma_int16_macs_per_cycle", "vector_bits",
              "ddr_bytes_per_second", "dma_bytes_per_cycle", "l2_bytes_per_cycle", "msmc_bytes_per_cycle"):
        if not figures[k] > 0:
            raise ConfigError(f"{where or path}: figure {k} must be > 0 (it divides), got {figures[k]!r}")
    return Target(name=name, description=str(data.get("description", name)),
                  source=f"pipeline/target/{path.name}", figures=figures,
                  assumed=tuple(data.get("assumed", ())), conflicting=tuple(data.get("conflicting", ())),
                  overridden=tuple(sorted(overrides)))


def check_target_spec(spec) -> None:
    """Load a model entry's ``[target]`` (:class:`pipeline.config.TargetSpec`) to check it.
    Raises ConfigError with one line naming the entry's file and model."""
    try:
        load_target(spec.target.name, spec.target.figures, where=f"{spec.source} (model {spec.name!r}) [target]")
    except ConfigError as e:
        msg = str(e)
        raise ConfigError(msg if str(spec.source) in msg else f"{spec.source} (model {spec.name!r}): {msg}") from None


def spec_target(spec) -> Target:
    """The target of a model entry (``[target]``, a :class:`pipeline.config.ModelSpec`)
    with its overrides. Raises ConfigError with one line naming the entry."""
    return load_target(spec.target.name, spec.target.figures, where=f"{spec.source} [target]")

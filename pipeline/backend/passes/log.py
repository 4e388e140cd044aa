"""OffloadLog: what every offload / cleanup pass decided, layer by layer.

The passes key each decision by its *anchor*: the name of the binding that
holds the layer's main op (``conv2d``, ``matmul``, the residual ``add``,
``max_pool2d``, the standalone ``relu`` / ``clip``) in the module the passes
received. Passes keep the original Relax variables of the bindings they do not
rewrite, so the anchors are names in the imported module and
:func:`pipeline.backend.manifest.build_manifest` can attach a backend and a
reason to every layer of ``mod_before``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

OFFLOADED = "offloaded"
DECLINED = "declined"
SIMPLIFIED = "simplified"


@dataclass(frozen=True)
class Decision:
    """One pass's verdict on one matched pattern.

    ``status`` is ``"offloaded"`` (replaced by ``call_tir`` to ``func``, which
    calls ``kernel`` on ``backend`` "mmalib" | "c7x"), ``"declined"`` (stays on
    the scalar path, ``reason`` says why) or ``"simplified"`` (a Q/DQ cleanup).
    ``note`` carries extra detail, e.g. a padded FC width.
    """

    pass_name: str
    anchor: str
    op: str
    dtype: str
    status: str
    kernel: str | None = None
    backend: str | None = None
    func: str | None = None
    reason: str | None = None
    note: str | None = None


class OffloadLog:
    """Ordered list of :class:`Decision`; one log is shared by all passes of a run."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []

    def offloaded(self, pass_name: str, anchor: str, op: str, dtype: str, kernel: str, backend: str,
                  func: str, note: str | None = None) -> Decision:
        """Record that ``anchor`` now calls ``kernel`` through PrimFunc ``func``."""
        return self._add(Decision(pass_name, anchor, op, dtype, OFFLOADED, kernel, backend, func,
                                  None, note))

    def declined(self, pass_name: str, anchor: str, op: str, dtype: str, reason: str) -> Decision:
        """Record that ``anchor`` matched ``pass_name``'s pattern but stays on the scalar path."""
        return self._add(Decision(pass_name, anchor, op, dtype, DECLINED, reason=reason))

    def simplified(self, pass_name: str, anchor: str, op: str, dtype: str, note: str) -> Decision:
        """Record a Q/DQ cleanup rewrite at ``anchor``."""
        return self._add(Decision(pass_name, anchor, op, dtype, SIMPLIFIED, note=note))

    def _add(self, d: Decision) -> Decision:
        self.decisions.append(d)
        return d

    def for_anchor(self, anchor: str) -> Decision | None:
        """The decision that settles ``anchor``: an offload if any pass offloaded it,
        else the last decline, else ``None``."""
        found = [d for d in self.decisions if d.anchor == anchor and d.status != SIMPLIFIED]
        done = [d for d in found if d.status == OFFLOADED]
        return (done or found or [None])[-1]

    def with_status(self, status: str) -> list[Decision]:
        """Decisions with the given status, in the order they were made."""
        return [d for d in self.decisions if d.status == status]

    def to_json(self) -> list[dict]:
        """JSON-serialisable list of all decisions (in order)."""
        return [asdict(d) for d in self.decisions]

    def __len__(self) -> int:
        return len(self.decisions)

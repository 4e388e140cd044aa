"""Where every artifact of a model lives: ``artifacts/<model>/...``.

Plain paths, no I/O: the stage registry declares each stage's inputs and
outputs with these, and ``docs/architecture.md`` ("Artifact layout") shows the
tree. No torch, no tvm.
"""

from __future__ import annotations

from pathlib import Path

from .config import ModelSpec, check_model_name

#: Files of one codegen build folder ``c/<variant>/`` (``weights_data.c`` is
#: added with ``weights_format = "c_array"``).
CODEGEN_FILES = ("model.c", "model.h", "tvm_kernels.c", "weights.bin", "manifest.json", "lowered.py",
                 "c7x_kernels.h", "c7x_tvm_shim.h", "c7x_memory.h", "c7x_memory.cmd", "memory_map.json")
#: the codegen files a bundle carries (the deployed build's C, weights and headers)
BUNDLED = ("model.c", "model.h", "tvm_kernels.c", "weights.bin", "weights_data.c", "c7x_kernels.h",
           "c7x_tvm_shim.h", "c7x_memory.h", "c7x_memory.cmd")
#: the files the bundle stage adds: the reference kernels, the example, its input and output, a Makefile, a README
BUNDLE_OWN = ("c7x_kernels_ref.c", "main.c", "input.f32", "expected.txt", "Makefile", "README.md")


def variants(spec: ModelSpec) -> list[str]:
    """Builds made for a model: the MMALIB build (if enabled) and the scalar baseline."""
    return ["mmalib", "scalar"] if spec.codegen.mmalib else ["scalar"]


class Layout:
    """Artifact paths of one model: everything under ``artifacts/<model>/``."""

    def __init__(self, artifacts: Path, name: str):
        check_model_name(name, "model entry")  # every write and delete stays inside artifacts/<model>/
        self.dir = artifacts / name
        self.float_pt2 = self.dir / "float.pt2"
        self.export_json = self.dir / "export.json"
        self.mixed_precision = self.dir / "mixed_precision.json"  # sensitivity measurements + choice
        self.int16_selection = self.dir / "int16_layers.json"  # the choice alone: what prepare reads
        self.prepared = self.dir / "prepared.pt"
        self.prepared_table = self.dir / "prepared_observers.txt"
        self.calibrated = self.dir / "calibrated.pt"
        self.calibration_json = self.dir / "calibration.json"
        self.quantized_pt2 = self.dir / "quantized.pt2"
        self.relax_script = self.dir / "relax" / "module.py"
        self.relax_params = self.dir / "relax" / "params.bin"
        self.relax_layers = self.dir / "relax" / "layers.json"
        self.report = self.dir / "report.json"
        self.torch_outputs = self.dir / "torch_outputs.npz"  # evaluate's PyTorch outputs, verify reads them
        self.holdout = self.dir / "holdout.json"  # k-fold held-out accuracy
        self.search = self.dir / "search.json"  # the recipe chosen for [quantizer] target
        self.search_folds = self.dir / "search_folds.npz"  # the chosen recipe's held-out outputs
        self.verify = self.dir / "verify.json"
        self.layers_json = self.dir / "layers.json"  # layers: per-layer numerics
        self.host_record = self.dir / "host" / "build.json"
        self.profile = self.dir / "profile.json"
        self.estimate = self.dir / "estimate.json"  # estimated C7x cycles per call and layer
        self.board_profile = self.dir / "board_profile.txt"  # the user's C7x log (no stage writes it)
        self.offload_html = self.dir / "offload.html"
        self.cross = self.dir / "c7x"
        self.bundle = self.dir / "bundle"   # bundle: what a firmware engineer takes away
        self.bundle_tar = self.dir / f"{name}_bundle.tar.gz"
        self.detections = self.dir / "detections"   # verify, detection models: pictures + index.html

    def detection_pictures(self, spec: ModelSpec, images: list[Path]) -> list[Path]:
        """What verify draws for a detection model: ``detections/<image stem>_<kind>.jpg``
        for every evaluation image and kind (``float``, ``qdq``, then ``c_<variant>`` per C
        build), and the ``index.html`` linking them; nothing for other models."""
        if not spec.detects:
            return []
        kinds = ["float", "qdq"] + [f"c_{v}" for v in variants(spec)]
        return [self.detections / f"{p.stem}_{k}.jpg" for p in images for k in kinds] + [
            self.detections / "index.html"]

    def stamp(self, stage: str) -> Path:
        """Input stamp of ``stage`` (see :mod:`pipeline.stamps`)."""
        return self.dir / ".stamps" / f"{stage}.json"

    def traceback(self, stage: str) -> Path:
        """Where an unexpected exception's traceback of ``stage`` is kept."""
        return self.dir / "logs" / f"{stage}.traceback.txt"

    def codegen_dir(self, variant: str) -> Path:
        """Generated C of one build variant ("mmalib" or "scalar")."""
        return self.dir / "c" / variant

    def host_exe(self, variant: str) -> Path:
        """Host test harness of one build variant."""
        return self.dir / "host" / f"{variant}.exe"

    def profile_exe(self, variant: str) -> Path:
        """Host harness of one build variant with the per-layer profile switched on."""
        return self.dir / "host" / "profile" / f"{variant}.exe"

    def codegen_files(self, spec: ModelSpec) -> list[Path]:
        """Every file codegen writes, over all variants of ``spec``."""
        extra = ("weights_data.c",) if spec.codegen.weights_format == "c_array" else ()
        return [d / f for d in map(self.codegen_dir, variants(spec)) for f in CODEGEN_FILES + extra]

    def bundle_files(self, spec: ModelSpec) -> list[Path]:
        """Every file of the bundle folder: the deployed build's :data:`BUNDLED` codegen
        files, then :data:`BUNDLE_OWN` (the bundle stage writes all of them)."""
        first = self.codegen_dir(variants(spec)[0])
        names = [f.name for f in self.codegen_files(spec) if f.parent == first and f.name in BUNDLED]
        return [self.bundle / n for n in names + list(BUNDLE_OWN)]

    def builds(self, spec: ModelSpec) -> dict[str, tuple[Path, Path]]:
        """variant -> (codegen folder, host executable)."""
        return {v: (self.codegen_dir(v), self.host_exe(v)) for v in variants(spec)}

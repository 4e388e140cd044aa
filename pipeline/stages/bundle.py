"""Stage ``bundle``: what a firmware engineer takes away, in one folder and one tarball.

``artifacts/<model>/bundle/`` (and ``<model>_bundle.tar.gz`` beside it, the same files
under ``<model>_bundle/``) holds the deployed build (the MMALIB one when enabled):

- ``model.c``, ``model.h``, ``tvm_kernels.c``, ``weights.bin`` (``weights_data.c`` when
  the entry embeds the weights), ``c7x_kernels.h``, ``c7x_tvm_shim.h``,
  ``c7x_memory.h`` and ``c7x_memory.cmd`` (the linker command file of the staged plan);
- ``c7x_kernels_ref.c``: the kernels in portable C99 (bit-exact with the build's
  verification; on the C7x, TI's MMALIB may replace the ``mmalib_*`` ones);
- ``main.c``: the worked example. ``./example weights.bin input.f32`` loads one input
  already preprocessed to the model's layout (float32 NCHW, ``<M>_INPUT_SIZE``
  floats: model.h gives the resize, crop, mean and std), runs the model and prints the
  top 5 (a classifier: ``index logit`` per line) or the detections with score >= 0.25
  (a detector: ``class score x1 y1 x2 y2``);
- ``input.f32``: the first evaluation image, preprocessed, and ``expected.txt``: what
  the example prints for it, from the verified host build;
- ``Makefile``: ``make`` (gcc), ``make check`` (runs the example, compares with
  expected.txt), ``make c7x`` (TI's cl7x with the flags of docs/reference.md, "TI
  toolchain", into ``libmodel.a``; needs ``TI_CGT_C7000_PATH``);
- ``README.md``: these lines for the user.

The tarball is byte-stable (sorted members, zero times and owners).
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import numpy as np

from ..backend.host import model_info, run_host
from ..backend.kernels.hostlib import KERNEL_SOURCES
from ..config import ModelSpec
from ..data.images import load_image, make_transform
from ..errors import CalibrationDataError
from ..fsutil import atomic_dir, write_bytes
from ..layout import BUNDLE_OWN, BUNDLED
from ..toolchain import C_FLAGS, RELEASE_FLAGS, common_flags

#: a detection row printed by the example (ultralytics' confidence threshold, data/detections.py)
CONF = 0.25

_MAIN = r"""/* main.c: the worked example of the {m} bundle (doit-c7x).
 *   ./example weights.bin input.f32
 * input.f32: {M}_INPUT_SIZE float32, the image preprocessed as model.h says. Prints {what}. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "model.h"

/* The whole file into a 64-byte aligned buffer (the weights blob must be; C99 has no aligned_alloc). */
static uint8_t* read_file(const char* path, size_t* n, void** base) {{
  FILE* f = fopen(path, "rb");
  long size;
  uint8_t* p;
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET) != 0) {{
    fclose(f);
    return NULL;
  }}
  *base = malloc((size_t)size + 64);
  p = *base == NULL ? NULL : (uint8_t*)*base + (64 - ((size_t)*base & 63u)) % 64;
  if (p == NULL || fread(p, 1, (size_t)size, f) != (size_t)size) p = NULL;
  fclose(f);
  *n = (size_t)size;
  return p;
}}

static float output[{M}_OUTPUT_SIZE];

int main(int argc, char** argv) {{
  size_t wbytes = 0, inbytes = 0;
  void *wbase = NULL, *inbase = NULL;
  const uint8_t* weights;
  const float* input;
  int rc, i;
  if (argc != 3) {{
    fprintf(stderr, "usage: %s weights.bin input.f32\n", argv[0]);
    return 2;
  }}
  weights = read_file(argv[1], &wbytes, &wbase);
  input = (const float*)read_file(argv[2], &inbytes, &inbase);
  if (weights == NULL || input == NULL || inbytes != sizeof(float) * {M}_INPUT_SIZE) {{
    fprintf(stderr, "cannot read %s, or %s is not %d float32\n", argv[1], argv[2], (int){M}_INPUT_SIZE);
    return 2;
  }}
  if ((rc = {m}_check_weights(weights, wbytes)) != 0 || (rc = {m}_run(weights, input, output)) != 0) {{
    fprintf(stderr, "{m}: error %d: %s\n", rc,
            rc == {M}_ERR_WEIGHTS ? "weights file is not this build's weights.bin (magic, version, size or CRC)"
            : rc == {M}_ERR_ALIGN ? "weights not 64-byte aligned"
            : rc == {M}_ERR_NULL ? "a NULL argument"
            : rc == {M}_ERR_WORKSPACE ? "a kernel needs more scratch than the static workspace"
            : rc <= {M}_ERR_KERNEL_BASE ? "a kernel call failed (-1000 - call index, model.c order)" : "see model.h");
    return 3;
  }}
{body}  free(wbase);
  free(inbase);
  return 0;
}}
"""

_TOP5 = """  {{
    int top[5];
    for (i = 0; i < 5 && i < {M}_OUTPUT_SIZE; ++i) {{ /* top 5 by selection (ties: the lower index) */
      int j, k, best = -1;
      for (j = 0; j < {M}_OUTPUT_SIZE; ++j) {{
        int taken = 0;
        for (k = 0; k < i; ++k) taken |= (top[k] == j);
        if (!taken && (best < 0 || output[j] > output[best])) best = j;
      }}
      top[i] = best;
      printf("%d %.6g\\n", best, (double)output[best]);
    }}
  }}
"""

_DETECTIONS = """  for (i = 0; i < {rows}; ++i) {{ /* rows [x1, y1, x2, y2, score, class], best first */
    const float* r = output + 6 * i;
    if (r[4] >= {conf}f) printf("%d %.6g %.6g %.6g %.6g %.6g\\n", (int)r[5], (double)r[4], (double)r[0],
                                (double)r[1], (double)r[2], (double)r[3]);
  }}
"""

_MAKEFILE = """# Makefile of the {m} bundle (doit-c7x). make: the example with gcc; make check: run it and
# compare with expected.txt; make c7x: TI's cl7x into libmodel.a (TI_CGT_C7000_PATH).
CC = gcc
CFLAGS ?= -std=c99 -O2 -ffp-contract=off
SRC = model.c tvm_kernels.c c7x_kernels_ref.c{extra}

example: main.c $(SRC)
\t$(CC) $(CFLAGS) -I. -o $@ main.c $(SRC) -lm

check: example
\t./example weights.bin input.f32 > output.txt
\tdiff -u expected.txt output.txt && echo "check: the example prints what the verified build printed"

CL7X = $(TI_CGT_C7000_PATH)/bin/cl7x
C7X_FLAGS = {c7x_flags} -I$(TI_CGT_C7000_PATH)/include -I.
c7x: $(SRC)
\t@test -n "$(TI_CGT_C7000_PATH)" || (echo "set TI_CGT_C7000_PATH to TI's C7000 code generation tools"; exit 2)
\tfor f in $(SRC); do $(CL7X) $(C7X_FLAGS) --compile_only --output_file=$${{f%.c}}.obj $$f || exit 1; done
\t$(TI_CGT_C7000_PATH)/bin/ar7x rq libmodel.a $(SRC:.c=.obj)

clean:
\trm -f example output.txt *.obj libmodel.a
.PHONY: check c7x clean
"""

_README = """# {m}: the deployable bundle

Built by doit-c7x from `models/{m}.toml` ({dtype}, {build} build), verified bit for bit
against its integer reference on the host.

```bash
make check        # gcc: build the example, run it on input.f32, compare with expected.txt
make c7x          # TI cl7x (TI_CGT_C7000_PATH): libmodel.a; link it with c7x_memory.cmd
```

`main.c` shows the whole API: `{m}_check_weights(blob, bytes)` once, then
`{m}_run(weights, input, output)` per image (not reentrant). `input` is
`{M}_INPUT_SIZE` float32 in NCHW, the image resized, center-cropped and normalized as
the `{M}_PREPROCESS_*` macros of `model.h` say; `output` is `{M}_OUTPUT_SIZE` float32
({output}). The weights blob must be 64-byte aligned. `c7x_memory.cmd` places the
model's L2 / MSMC / DDR sections; list it before your SDK's linker command file.
"""


def _flags_text() -> str:
    """The cl7x flags of :mod:`pipeline.toolchain` without the CGT include (the Makefile adds it)."""
    return " ".join(common_flags(None) + C_FLAGS + RELEASE_FLAGS)


def expected_lines(output: np.ndarray, detecting: bool) -> list[str]:
    """What ``main.c`` prints for ``output`` (float32 [OUTPUT_SIZE]), formatted as the C does
    (``%.6g`` of the float32 value as a double: Python's ``%`` formats the same digits)."""
    out = np.asarray(output, np.float32).ravel()
    if detecting:
        rows = out.reshape(-1, 6)
        return ["%d %.6g %.6g %.6g %.6g %.6g" % (int(r[5]), r[4], r[0], r[1], r[2], r[3])
                for r in rows if r[4] >= np.float32(CONF)]
    order = sorted(range(len(out)), key=lambda j: (-out[j], j))[:5]
    return ["%d %.6g" % (j, out[j]) for j in order]


def bundle_model(spec: ModelSpec, codegen_dir: Path, exe: Path, image: Path | None, out: Path,
                 tarball: Path) -> dict:
    """Write the bundle folder ``out`` and ``tarball`` (module docstring) for the build in
    ``codegen_dir`` whose host executable ``exe`` made the example's expected output on
    ``image`` (preprocessed as the entry says). Returns ``{"files": [...], "expected": [...]}``.
    Raises CalibrationDataError for an unreadable image, ToolchainError if the host
    executable fails."""
    if image is None:
        raise CalibrationDataError(f"model '{spec.name}': evaluation set '{spec.evaluation_set}' has no image "
                                   f"for the bundle's example input; add .jpg/.jpeg/.png images there")
    info = model_info(codegen_dir)
    m, M = info.c_name, info.c_name.upper()
    x = load_image(image, make_transform(spec.preprocess)).numpy()[None].astype(np.float32)
    detecting = spec.detects
    output = run_host(exe, codegen_dir, x)[0]
    if detecting:   # output 0 leads the packed buffer; a segmentation model's masks follow it
        output = info.split(output[None])[0][0]
    expected = expected_lines(output, detecting)
    if detecting:
        body = _DETECTIONS.format(rows=output.size // 6, conf=CONF)
        what = f"the detections with score >= {CONF} (class score x1 y1 x2 y2)"
    else:
        body, what = _TOP5.format(M=M), "the top 5 (index logit)"
    extra = " weights_data.c" if (codegen_dir / "weights_data.c").exists() else ""
    with atomic_dir(out) as tmp:
        for name in BUNDLED:
            if (codegen_dir / name).exists():
                shutil.copy(codegen_dir / name, tmp / name)
        for src in map(Path, KERNEL_SOURCES):  # their names are layout.BUNDLE_OWN's first
            shutil.copy(src, tmp / src.name)
        (tmp / "main.c").write_text(_MAIN.format(m=m, M=M, what=what, body=body))
        (tmp / "input.f32").write_bytes(x.tobytes())
        (tmp / "expected.txt").write_text("".join(line + "\n" for line in expected))
        (tmp / "Makefile").write_text(_MAKEFILE.format(m=m, extra=extra, c7x_flags=_flags_text()))
        (tmp / "README.md").write_text(_README.format(
            m=m, M=M, dtype=spec.dtype, build=codegen_dir.name,
            output="detection rows [x1, y1, x2, y2, score, class]" if detecting else "one logit per class"))
        files = sorted(p.name for p in tmp.iterdir())
        assert set(BUNDLE_OWN) <= set(files), "layout.BUNDLE_OWN names a file the stage did not write"
    write_bytes(tarball, _tar(out, f"{spec.name}_bundle"))
    return {"files": files, "expected": expected}


def _tar(folder: Path, prefix: str) -> bytes:
    """A gzip tarball of ``folder``'s files under ``prefix/``, byte-stable."""
    import gzip

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for p in sorted(folder.iterdir()):
            data = p.read_bytes()
            info = tarfile.TarInfo(f"{prefix}/{p.name}")
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(raw.getvalue(), mtime=0)

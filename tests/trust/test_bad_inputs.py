"""Inputs that must not crash or escape (issue 27): image headers are checked
before decoding, odd folder entries are named, model names cannot leave
artifacts/<model>/. Each case: one line naming the file and what to do."""

from __future__ import annotations

import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from doitproj import Project, write_jpeg
from pipeline.config import PreprocessSpec, list_images
from pipeline.entries import load_models
from pipeline.errors import CalibrationDataError


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def png_bomb(w: int = 60000, h: int = 60000) -> bytes:
    """A tiny PNG that declares w x h 8-bit RGB pixels (the header alone)."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\0")) + _chunk(b"IEND", b""))


def jpeg_declaring(path: Path, w: int, h: int) -> bytes:
    """A real JPEG whose SOF0 header is patched to declare w x h pixels."""
    write_jpeg(path, 0)
    data = bytearray(path.read_bytes())
    sof = data.index(b"\xff\xc0")
    data[sof + 5:sof + 9] = struct.pack(">HH", h, w)
    return bytes(data)


def _pil(fmt: str, **kw) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    frames = kw.pop("frames", None)
    mode = kw.pop("mode", "RGB")
    img = Image.new(mode, (40, 40))
    if frames:
        img.save(buf, fmt, save_all=True, append_images=[Image.new(mode, (40, 40), (255, 0, 0))] * (frames - 1))
    else:
        img.save(buf, fmt, **kw)
    return buf.getvalue()


CASES = {
    "bomb_1.png": (lambda d: png_bomb(), "declares 60000x60000 pixels, too many"),
    "wide_2.png": (lambda d: png_bomb(20000, 5000), "declares 20000x5000 pixels, too many"),
    "huge_3.jpg": (lambda d: jpeg_declaring(d / "src.jpg", 65000, 65000), "too many pixels"),
    "gif_4.jpg": (lambda d: _pil("GIF"), "is a GIF image, not a JPEG or PNG"),
    "anim_5.png": (lambda d: _pil("PNG", frames=3), "an animated PNG (3 frames)"),
    "deep_6.png": (lambda d: _pil("PNG", mode="I;16"), "not 8-bit"),
    "bmp_7.png": (lambda d: _pil("BMP"), "is a BMP image"),
    "text_8.jpg": (lambda d: b"hello", "not a readable JPEG/PNG image (no known image header)"),
    "cut_10.png": (lambda d: png_bomb()[:20], "not a readable JPEG/PNG image"),
    "webp_11.jpg": (lambda d: _pil("WEBP"), "is a WEBP image"),
    "empty_9.jpg": (lambda d: b"", "empty file"),
    # few pixels, but resizing its short side to the preprocessing's size would take gigabytes
    "tall_12.png": (lambda d: png_bomb(1, 300000), "declares 1x300000 pixels, sides in a ratio over 32:1"),
    "wide_13.jpg": (lambda d: jpeg_declaring(d / "src.jpg", 4000, 100), "sides in a ratio over 32:1"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_image_is_refused_before_decoding_in_one_line(tmp_path, name):
    from pipeline.data.images import load_image, make_transform
    make, needle = CASES[name]
    (tmp_path / name).write_bytes(make(tmp_path))
    with pytest.raises(CalibrationDataError) as e:
        load_image(tmp_path / name, make_transform(PreprocessSpec(resize=36, crop=32)))
    msg = str(e.value)
    assert needle in msg and str(tmp_path / name) in msg and "\n" not in msg


def test_the_png_bomb_cannot_crash_a_process_that_loads_it(tmp_path):
    """Run in a child so that a crash (SIGSEGV before the check) fails the test, not pytest."""
    (tmp_path / "bomb_1.png").write_bytes(png_bomb())
    code = ("import sys; from pathlib import Path; from pipeline.config import PreprocessSpec\n"
            "from pipeline.data.images import load_images\n"
            "from pipeline.errors import CalibrationDataError\n"
            f"try: load_images([Path({str(tmp_path / 'bomb_1.png')!r})], PreprocessSpec(resize=36, crop=32), 'x')\n"
            "except CalibrationDataError as e: print('refused:', e); sys.exit(0)\n"
            "sys.exit(5)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stdout + run.stderr
    assert "refused:" in run.stdout and "bomb_1.png" in run.stdout


def test_folders_and_dangling_links_named_like_images_are_named_when_a_stage_lists(tmp_path):
    write_jpeg(tmp_path / "ok_1.jpg", 1)
    (tmp_path / "dir_2.jpg").mkdir()
    assert list_images(tmp_path) == [tmp_path / "ok_1.jpg"]  # the task list still loads
    with pytest.raises(CalibrationDataError, match=r"dir_2.jpg: a folder, not an image; rename or remove it"):
        list_images(tmp_path, strict=True)
    (tmp_path / "dir_2.jpg").rmdir()
    (tmp_path / "gone_3.jpg").symlink_to(tmp_path / "nowhere.jpg")
    with pytest.raises(CalibrationDataError, match=r"gone_3.jpg: a link to a missing file"):
        list_images(tmp_path, strict=True)
    (tmp_path / "gone_3.jpg").unlink()
    (tmp_path / "loop_4.jpg").symlink_to(tmp_path / "loop_5.jpg")
    (tmp_path / "loop_5.jpg").symlink_to(tmp_path / "loop_4.jpg")
    with pytest.raises(CalibrationDataError, match=r"loop_4.jpg: a symbolic link loop, not an image"):
        list_images(tmp_path, strict=True)


@pytest.mark.parametrize("stem", ["..", ".hidden", "a b", "x/"[:1] + "\\y", "-" * 101])
def test_model_names_that_could_leave_the_artifacts_folder_are_refused(tmp_path, stem):
    (tmp_path / f"{stem}.toml").write_text('builder = "tinynets:small_cnn"\n')
    (entry,) = load_models(tmp_path)
    assert type(entry).__name__ == "InvalidModel" and "rename the file" in str(entry.error)


def test_a_dotdot_model_touches_nothing_outside_its_folder(tmp_path):
    p = Project(tmp_path / "proj")
    p.add_images("setA", 2)
    p.add_model("tiny", "setA")
    (p.root / "models" / "...toml").write_text((p.root / "models" / "tiny.toml").read_text())
    for mine in ("c/model.c", "host/notes.txt", "report.json"):
        (p.root / mine).parent.mkdir(parents=True, exist_ok=True)
        (p.root / mine).write_text("the user's own file")
    run = p.doit("export:tiny", "export:..")
    assert run.returncode != 0
    assert "model name '..' (the file name) must be letters" in run.out
    assert (p.root / "artifacts" / "tiny" / "float.pt2").is_file()  # the healthy model built
    cleaned = p.doit("clean")
    assert cleaned.returncode == 0, cleaned.out
    for mine in ("c/model.c", "host/notes.txt", "report.json"):
        assert (p.root / mine).read_text() == "the user's own file"


BADNETS = '''import torch
def raising():
    raise RuntimeError("the builder broke: missing file foo.yaml")
class Dyn(torch.nn.Module):
    def forward(self, x):
        return x * 2 if x.sum() > 0 else x
def untraceable():
    return Dyn()
'''


@pytest.mark.parametrize("case, needle", [
    ("empty", "is not a loadable state_dict checkpoint (EOFError)"),
    ("raising", "builder 'badnets:raising' raised RuntimeError: the builder broke"),
    ("untraceable", "torch.export cannot trace 'badnets:untraceable'"),
])
def test_a_model_that_cannot_be_built_fails_export_in_one_line(tmp_path, case, needle, capfd):
    import dataclasses

    from doitproj import tiny_spec
    from pipeline.config import WeightsSpec
    from pipeline.errors import PipelineError
    from pipeline.stages.export import export_model
    (tmp_path / "badnets.py").write_text(BADNETS)
    (tmp_path / "empty.pt").write_bytes(b"")
    spec = tiny_spec(tmp_path)
    spec = {"empty": dataclasses.replace(spec, weights=WeightsSpec(path=str(tmp_path / "empty.pt"))),
            "raising": dataclasses.replace(spec, builder="badnets:raising"),
            "untraceable": dataclasses.replace(spec, builder="badnets:untraceable")}[case]
    with pytest.raises(PipelineError) as e:
        export_model(spec, None, tmp_path / "float.pt2", tmp_path)
    assert needle in str(e.value) and "\n" not in str(e.value) and "model 'tiny'" in str(e.value)
    assert not (tmp_path / "float.pt2").exists()
    printed = capfd.readouterr()
    assert "def forward" not in printed.out + printed.err   # torch's graph dump is held back...
    if case == "untraceable":                                 # ...in a report the line names
        log = tmp_path / "export-error.log"
        assert str(log) in str(e.value) and "def forward" in log.read_text()


def test_an_unknown_file_never_makes_ultralytics_install_anything(tmp_path, capsys):
    """ultralytics replaces PIL.Image.open on import with one that pip-installs a HEIF
    plugin for a file Pillow cannot identify; the header check does not go through it."""
    import PIL.Image
    pytest.importorskip("ultralytics")
    import ultralytics.utils.patches  # noqa: F401  (installs its PIL.Image.open)
    from pipeline.data.images import load_image, make_transform
    (tmp_path / "odd_1.jpg").write_bytes(b"\x00\x00\x00\x18ftypheic" + b"\x00" * 64)  # a HEIC photo
    with pytest.raises(CalibrationDataError, match="is a HEIF/AVIF image, not a JPEG or PNG"):
        load_image(tmp_path / "odd_1.jpg", make_transform(PreprocessSpec(resize=36, crop=32)))
    (tmp_path / "odd_2.jpg").write_bytes(b"hello")
    with pytest.raises(CalibrationDataError, match="no known image header"):
        load_image(tmp_path / "odd_2.jpg", make_transform(PreprocessSpec(resize=36, crop=32)))
    out = capsys.readouterr()
    assert "pi-heif" not in out.out + out.err and PIL.Image.open.__module__ != "PIL.Image"

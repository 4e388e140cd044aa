"""Bad input: one clear error naming the file and what to do, and no partial artifact."""


import pytest

from doitproj import Project, write_jpeg
from pipeline.config import CalibrationSpec, PreprocessSpec
from pipeline.errors import CalibrationDataError


def test_corrupt_and_truncated_and_empty_images_are_named(tmp_path):
    from pipeline.data.images import load_image, make_transform
    t = make_transform(PreprocessSpec(resize=36, crop=32))
    good = tmp_path / "good_1.jpg"
    write_jpeg(good, 0)
    assert tuple(load_image(good, t).shape) == (3, 32, 32)
    cases = {"notes_2.jpg": b"this is a text file", "cut_3.jpg": good.read_bytes()[:200], "empty_4.jpg": b""}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(CalibrationDataError) as e:
            load_image(tmp_path / name, t)
        msg = str(e.value)
        assert str(tmp_path / name) in msg and "replace or remove the file" in msg
        assert ".cpp" not in msg and "\n" not in msg


def test_no_decode_is_running_when_the_error_surfaces(tmp_path, monkeypatch):
    """A decode thread still inside torchvision at interpreter exit aborts the
    process (SIGABRT): the error is raised only after every started decode ended."""
    import threading
    import time

    import pipeline.data.images as images
    for i in range(12):
        write_jpeg(tmp_path / f"ok_{i:02d}_{i}.jpg", i, size=160)
    (tmp_path / "aa_bad_0.jpg").write_bytes(b"not an image")
    running, lock = [0], threading.Lock()
    real = images.load_image

    def slow_load(path, transform):
        with lock:
            running[0] += 1
        try:
            time.sleep(0.02)
            return real(path, transform)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(images, "load_image", slow_load)
    with pytest.raises(CalibrationDataError, match="aa_bad_0.jpg"):
        for _ in images.iter_images(sorted(tmp_path.iterdir()), PreprocessSpec(resize=36, crop=32)):
            pass
    assert running[0] == 0


def test_empty_calibration_folder_says_what_to_do(tmp_path):
    from pipeline.data.images import select_images
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "README.txt").write_text("no images here")
    with pytest.raises(CalibrationDataError, match=r"model 'm': calibration folder .*empty is missing or holds no"):
        select_images(tmp_path / "empty", CalibrationSpec(), "m")
    with pytest.raises(CalibrationDataError, match="add .jpg/.jpeg/.png images there"):
        select_images(tmp_path / "nope", CalibrationSpec(), "m")
    (tmp_path / "shipped.source.toml").write_text("")  # a set the assets step can fetch
    with pytest.raises(CalibrationDataError, match="python -m pipeline.assets"):
        select_images(tmp_path / "shipped", CalibrationSpec(), "m")


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """A project with a healthy model and one bad model per kind of bad input."""
    p = Project(tmp_path_factory.mktemp("bad"))
    p.add_images("good", 2, seed0=0)
    p.add_images("corrupt", 2, seed0=5)
    (p.root / "calib_data" / "corrupt" / "zz_broken_3.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    (p.root / "calib_data" / "emptyset").mkdir()
    p.add_model("healthy", "good")
    p.add_model("bad_jpeg", "corrupt")
    p.add_model("no_images", "emptyset")
    p.add_model("bad_dtype", "good", dtype="int4")
    p.add_model("small_l2", "good", extra="[target]\nl2_sram_bytes = 256\n")  # no conv tile fits
    (p.root / "models" / "bad_builder.toml").write_text(
        (p.root / "models" / "healthy.toml").read_text().replace("tinynets:small_cnn", "tinynets:no_such_net"))
    (p.root / "models" / "no_weights.toml").write_text(
        (p.root / "models" / "healthy.toml").read_text().replace(
            "pretrained = false", 'file = "tiny-0123abcd.pth"'))
    (p.root / "models" / "crashy.toml").write_text(
        (p.root / "models" / "healthy.toml").read_text().replace("tinynets:small_cnn", "tinynets:crashing"))
    run = p.doit("evaluate", "codegen:small_l2", env={"TORCH_HOME": str(p.root / "torch_home")})
    return p, run


def _failure_message(run, task):
    """The one line a failed model gets: ``<model>: FAILED at <stage>: ...`` (``*:model``: any
    stage; an invalid entry: ``<model>: FAILED (...)``), and that it is the only one."""
    stage, model = task.split(":")
    lines = [line for line in run.out.splitlines() if line.startswith(f"{model}: FAILED")]
    assert len(lines) == 1, run.out
    assert stage == "*" or lines[0].startswith(f"{model}: FAILED at {stage}: "), lines[0]
    return lines[0]


@pytest.mark.parametrize("task, needles", [
    ("calibrate:bad_jpeg", ["model 'bad_jpeg': ", "zz_broken_3.jpg: not a readable JPEG/PNG image",
                            "replace or remove the file"]),
    ("calibrate:no_images", ["calib_data/emptyset is missing or holds no", "add .jpg/.jpeg/.png images there"]),
    ("*:bad_dtype", ["bad_dtype.toml", "dtype 'int4' is not supported; use one of int8, int16"]),
    ("export:bad_builder", ["bad_builder.toml", "builder 'tinynets:no_such_net' not found"]),
    ("export:no_weights", ["model 'no_weights': weights not found", "tiny-0123abcd.pth", "weights.path"]),
    ("export:crashy", ["model 'crashy': unexpected RuntimeError: boom inside the builder",
                       "artifacts/crashy/logs/export.traceback.txt"]),
    ("codegen:small_l2", ["small_l2.toml", "L2 SRAM of 256 bytes is too small for mmalib_conv2d_i8_0: one output "
                          "channel of its weights is", "raise [target] l2_sram_bytes to at least 512"]),
])
def test_each_bad_model_fails_with_one_clear_line(broken, task, needles):
    _, run = broken
    assert run.returncode in (1, 2)  # doit: task failed / dependency unmet; a crash would be -6 (SIGABRT)
    msg = _failure_message(run, task)
    for n in needles:
        assert n in msg, msg
    assert "Traceback" not in run.out


def test_failures_leave_no_artifacts_and_healthy_model_builds(broken):
    p, run = broken
    art = p.root / "artifacts"
    assert (art / "healthy" / "report.json").is_file()
    assert not (art / "bad_jpeg" / "calibrated.pt").exists()
    assert not (art / "no_images" / "calibrated.pt").exists()
    assert not (art / "bad_builder" / "float.pt2").exists()
    assert not (art / "no_weights" / "float.pt2").exists()
    assert not (art / "small_l2" / "c" / "mmalib").exists()
    assert "RuntimeError: boom" in (art / "crashy" / "logs" / "export.traceback.txt").read_text()
    leftovers = [f for f in art.rglob("*") if f.name.startswith(".tmp-")]
    assert leftovers == []


def test_fixing_the_input_rebuilds_only_what_failed(broken):
    p, _ = broken
    (p.root / "calib_data" / "corrupt" / "zz_broken_3.jpg").unlink()
    run = p.doit("evaluate:bad_jpeg", "evaluate:healthy", env={"TORCH_HOME": str(p.root / "torch_home")})
    assert run.returncode == 0, run.out
    assert run.ran("calibrate") == {"bad_jpeg"} and run.ran("export") == set()

"""The cross_compile stage builds TI's documented command lines (docs/reference.md,
"TI toolchain") and
runs them; a stand-in cl7x/ar7x records its arguments (no TI tools here)."""

import json
import stat
from pathlib import Path

import pytest

from pipeline.config import ModelSpec, WeightsSpec
from pipeline.errors import ToolchainError

REPO = Path(__file__).resolve().parents[2]

FAKE_TOOL = """#!/bin/sh
echo "$(basename "$0") $*" >> "{log}"
for a in "$@"; do
  case "$a" in --output_file=*) echo obj > "${{a#--output_file=}}";; esac
done
if [ "$(basename "$0")" = ar7x ]; then echo lib > "$2"; fi
{fail}
"""


def fake_cgt(tmp_path, fail_on=None) -> Path:
    cgt = tmp_path / "ti-cgt-c7000_5.0.1.LTS"
    (cgt / "bin").mkdir(parents=True)
    (cgt / "include").mkdir()
    for tool in ("cl7x", "ar7x"):
        fail = f'case "$*" in *{fail_on}*) echo "error #20: identifier x is undefined" >&2; exit 1;; esac' \
            if fail_on and tool == "cl7x" else ""
        p = cgt / "bin" / tool
        p.write_text(FAKE_TOOL.format(log=tmp_path / "calls.log", fail=fail))
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return cgt


def spec(tmp_path):
    return ModelSpec(name="net", source=tmp_path / "net.toml", builder="a:b", input_shape=(1, 3, 8, 8),
                     weights=WeightsSpec(pretrained=False))


def codegen_dir(tmp_path) -> Path:
    d = tmp_path / "c" / "mmalib"
    d.mkdir(parents=True, exist_ok=True)
    for f in ("model.c", "tvm_kernels.c"):
        (d / f).write_text("int x;\n")
    (d / "model.h").write_text("")
    (d / "c7x_memory.cmd").write_text("SECTIONS\n{\n    .l2sram  > L2SRAM\n}\n")
    return d


def test_commands_follow_ti_flags_and_library_is_built(tmp_path, monkeypatch):
    from pipeline.stages.cross_compile import cross_compile_model
    cgt = fake_cgt(tmp_path)
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(cgt))
    out = tmp_path / "c7x"
    info = cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), out)
    calls = (tmp_path / "calls.log").read_text().splitlines()
    compiles = [c for c in calls if c.startswith("cl7x ")]
    assert len(compiles) == 3  # model.c, tvm_kernels.c, the reference kernels
    for c in compiles:
        for flag in ("-mv7524", "--abi=eabi", "--endian=little", "--c99", "-O3", "--auto_inline=500",
                     "--fp_mode=relaxed", "-DSOC_J722S", f"-I{cgt / 'include'}", "--compile_only"):
            assert flag in c.split(), (flag, c)
        assert "--silicon_version" not in c
    assert calls[-1].startswith("ar7x rq libnet.lib model.obj tvm_kernels.obj")
    assert (out / "libnet.lib").is_file()
    from pipeline.toolchain import cross_outputs as outputs
    assert sorted(outputs("net", ["model.c", "tvm_kernels.c"])) == sorted(p.name for p in out.iterdir())
    assert json.loads((out / "build.json").read_text())["commands"] == info["commands"]
    assert (out / "c7x_memory.cmd").read_text() == (tmp_path / "c" / "mmalib" / "c7x_memory.cmd").read_text()


def test_firmware_link_line_places_the_model_sections(tmp_path, monkeypatch):
    """build.json's link line lists the model's c7x_memory.cmd before the application's
    linker file; run as given (placeholders filled) it reaches the linker whole."""
    import subprocess

    from pipeline.stages.cross_compile import cross_compile_model
    cgt = fake_cgt(tmp_path)
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(cgt))
    out = tmp_path / "c7x"
    link = cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), out)["link"]
    assert link[0] == str(cgt / "bin" / "cl7x") and "--run_linker" in link and "-mv7524" in link
    order = [a for a in link if a in ("libnet.lib", "c7x_memory.cmd", "<app linker.cmd>")]
    assert order == ["libnet.lib", "c7x_memory.cmd", "<app linker.cmd>"]
    (out / "app.obj").write_text("obj")
    (out / "app.cmd").write_text("MEMORY { L2SRAM: o = 0x7E000000, l = 0x140000 }")
    filled = [{"<app objects>": "app.obj", "<app linker.cmd>": "app.cmd", "<firmware>.out": "fw.out"}.get(a, a)
              for a in link]
    filled = [a.replace("<firmware>.out", "fw.out") for a in filled]
    assert subprocess.run(filled, cwd=out).returncode == 0
    last = (tmp_path / "calls.log").read_text().splitlines()[-1]
    assert last.startswith("cl7x ") and last.endswith("--run_linker --output_file=fw.out --reread_libs "
                                                      "--warn_sections app.obj libnet.lib c7x_memory.cmd app.cmd")
    assert (out / "fw.out").is_file()


def test_missing_toolchain_is_one_clear_line(tmp_path, monkeypatch):
    from pipeline.stages.cross_compile import cross_compile_model
    monkeypatch.delenv("TI_CGT_C7000_PATH", raising=False)
    with pytest.raises(ToolchainError) as e:
        cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), tmp_path / "c7x")
    assert "TI_CGT_C7000_PATH is not set" in str(e.value) and "\n" not in str(e.value)
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(tmp_path / "nowhere"))
    with pytest.raises(ToolchainError, match="has no executable bin/cl7x"):
        cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), tmp_path / "c7x")
    cgt = fake_cgt(tmp_path)
    (cgt / "bin" / "ar7x").chmod(0o644)
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(cgt))
    with pytest.raises(ToolchainError, match="has no executable bin/ar7x"):
        cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), tmp_path / "c7x")


def test_compiler_error_is_reported_and_leaves_no_output(tmp_path, monkeypatch):
    from pipeline.stages.cross_compile import cross_compile_model
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(fake_cgt(tmp_path, fail_on="tvm_kernels.c")))
    with pytest.raises(ToolchainError,
                       match=r"cl7x failed on tvm_kernels.c \(exit 1\): error #20: identifier x is undefined"):
        cross_compile_model(spec(tmp_path), codegen_dir(tmp_path), tmp_path / "c7x")
    assert not (tmp_path / "c7x").exists()


def test_default_run_includes_cross_compile_only_with_the_toolchain(tmp_path, monkeypatch):
    from pipeline.tasks import Project
    monkeypatch.delenv("TI_CGT_C7000_PATH", raising=False)
    default = Project(REPO / "models").doit_config()["default_tasks"]
    assert "summary" in default and not any(t.startswith("cross_compile") for t in default)
    monkeypatch.setenv("TI_CGT_C7000_PATH", str(fake_cgt(tmp_path)))
    default = Project(REPO / "models").doit_config()["default_tasks"]
    assert "cross_compile:mobilenet_v2" in default and "summary" in default


def test_asking_for_cross_compile_without_toolchain_fails_naming_the_variable(tmp_path, monkeypatch):
    """The doit action turns the error into one TaskFailed line (no traceback)."""
    from doit.exceptions import TaskFailed

    from pipeline.tasks.actions import run_stage
    monkeypatch.delenv("TI_CGT_C7000_PATH", raising=False)
    args = {"spec": spec(tmp_path), "codegen_dir": codegen_dir(tmp_path), "out": tmp_path / "c7x"}
    result = run_stage("cross_compile", "m", args)
    assert isinstance(result, TaskFailed)
    assert result.message.startswith("cross_compile: TI_CGT_C7000_PATH is not set")
    assert "\n" not in result.message and not (tmp_path / "c7x").exists()

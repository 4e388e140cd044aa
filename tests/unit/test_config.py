"""Model entries: parsing, defaults, `extends`, and clear errors naming the file."""

from pathlib import Path

import pytest

from pipeline.config import ModelSpec
from pipeline.entries import InvalidModel, load_models

REPO = Path(__file__).resolve().parents[2]


def write(tmp_path, name, text):
    d = tmp_path / "models"
    d.mkdir(exist_ok=True)
    (d / f"{name}.toml").write_text(text)
    return d


BASE = 'builder = "torchvision.models:mobilenet_v2"\ninput_shape = [1, 3, 224, 224]\n[weights]\nfile = "m-b0353104.pth"\n'


def test_shipped_entries_are_valid():
    entries = {e.name: e for e in load_models(REPO / "models")}
    assert {"mobilenet_v2", "mobilenet_v2_int16", "resnet18"} <= set(entries)
    assert all(isinstance(e, ModelSpec) for e in entries.values())
    assert entries["mobilenet_v2"].dtype == "int8"
    assert entries["mobilenet_v2_int16"].dtype == "int16"
    assert entries["mobilenet_v2_int16"].weights == entries["mobilenet_v2"].weights
    assert entries["resnet18"].weights.optional
    assert entries["mobilenet_v2"].description.startswith("MobileNetV2 (torchvision)")


def test_defaults_and_roundtrip(tmp_path):
    (spec,) = load_models(write(tmp_path, "m", BASE))
    assert spec.calibration.set == "imagenet20" and spec.calibration.observer == "percentile"
    assert spec.preprocess.crop == 224 and spec.codegen.mmalib
    assert spec.calibration.exact_requantize and not spec.calibration.equalize


@pytest.mark.parametrize("text, needle", [
    ('dtype = "int4"\n' + BASE, "dtype 'int4' is not supported; use one of int8, int16"),
    (BASE.replace("mobilenet_v2", "mobilenet v2"), "'builder' must be 'module:callable'"),
    (BASE + "[calibration]\nobserver = \"kl\"\n", "calibration.observer 'kl' is not supported"),
    (BASE + "[calibration]\nbatch = 4\n", "unknown key(s) ['batch'] in [calibration]"),
    (BASE.replace("[1, 3, 224, 224]", "[2, 3, 224, 224]"), "batch must be 1"),
    ("builder = [", "not valid TOML"),
    ('builder = "a:b"\ninput_shape = [1, 3, 8, 8]\npreprocess = { resize = 8, crop = 8 }\n',
     "[weights] needs 'file'"),
    ("builder_kwargs = 5\n" + BASE, "'builder_kwargs' must be a table"),
    ('preprocess = { resize = "big" }\n' + BASE, "preprocess.resize must be a positive number"),
    ("preprocess = { mean = 0.5 }\n" + BASE, "preprocess.mean needs 3 numbers"),
    ("preprocess = { std = [0, 1, 1] }\n" + BASE, "preprocess.std must be positive"),
    ("preprocess = { resize = 40, crop = 32 }\n" + BASE, "does not match the preprocessing"),
    ('extends = ["x"]\n' + BASE, "'extends' must be the name of another model entry"),
    (BASE + "[evaluation]\nset = 5\n", "evaluation.set must be a folder name"),
    (BASE + '[codegen]\nmemory = "l2"\n', "codegen.memory 'l2' is not supported; use one of staged, flat"),
    ("description = 5\n" + BASE, "'description' must be a string, got 5"),
    (BASE + "[calibration]\nequalize_alpha = 1.5\n", "calibration.equalize_alpha must be in [0, 1]"),
    (BASE + "[calibration]\nequalize = true\nshards = 2\n", "cannot be used with equalize = true"),
    (BASE + "[calibration]\nrange_search = true\nobserver = \"minmax\"\n", "needs observer = 'percentile'"),
    (BASE + "[calibration]\nrange_search = \"logits\"\n", "calibration.range_search must be false, true"),
    (BASE + "[calibration]\nadaround_iterations = -5\n", "calibration.adaround_iterations must be an integer >= 0"),
    (BASE + "[calibration]\nexact_requantize = 1\n", "calibration.exact_requantize must be bool, got 1"),
    (BASE + '[quantizer]\nweight_dtype = "int16"\n', "sets the weights of int16 layers: it needs dtype = 'int16'"),
    (BASE + '[quantizer]\ntarget = 0.2\n', "quantizer.target must be a table such as"),
    (BASE + '[quantizer]\ntarget = { metric = "cosine", min = 0.9 }\n',
     "quantizer.target.metric 'cosine' does not score a classification model; use one of logit_error, "
     "relative_logit_error, top1_agreement"),
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", min = 0.2 }\n', "quantizer.target needs max = a number"),
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, budget = 3 }\n',
     "unknown key(s) ['budget'] in quantizer.target"),
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, max_mcycles = 0 }\n',
     "quantizer.target.max_mcycles must be a positive number"),
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, per_image = 0.5 }\n',
     "quantizer.target.per_image is a floor of detections_matched on every image; metric 'logit_error' has none"),
    ('task = "detection"\n' + BASE + '[quantizer]\ntarget = { metric = "detections_matched", min = 0.9, '
     'per_image = 1.5 }\n', "quantizer.target.per_image must be a share in [0, 1]"),
    ('dtype = "int16"\n' + BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, int16 = true }\n',
     "mixed precision (int16_layers / mixed_precision) needs dtype = \"int8\""),
    # the search sets these for every candidate: an entry's own value would be dropped unseen
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2 }\nsymmetric_activations = false\n'
     '[calibration]\nadaround_iterations = 200\n',
     "calibration.adaround_iterations, quantizer.symmetric_activations are chosen by the recipe search "
     "(quantizer.target): remove them, or set target = false"),
    (BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, int16 = true }\nweight_dtype = "int16"\n',
     "quantizer.weight_dtype is chosen by the recipe search"),
])
def test_invalid_entry_names_file_and_fix(tmp_path, text, needle):
    (entry,) = load_models(write(tmp_path, "bad", text))
    assert isinstance(entry, InvalidModel)
    msg = str(entry.error)
    assert needle in msg
    assert str(tmp_path / "models" / "bad.toml") in msg


def test_spelled_out_defaults_give_the_same_spec(tmp_path):
    d = write(tmp_path, "a", BASE)
    write(tmp_path, "b", BASE + '[quantizer]\nweight_dtype = "int8"\n')
    a, b = load_models(d)
    assert a.quantizer == b.quantizer and a.evaluation_set == "imagenet20"


def test_int16_weights_reach_the_int16_layers_of_a_mixed_entry(tmp_path):
    (spec,) = load_models(write(tmp_path, "m", BASE + '[quantizer]\nweight_dtype = "int16"\n'
                                                    'int16_layers = ["features.0.*"]\n'))
    assert not isinstance(spec, InvalidModel), spec
    assert spec.dtype == "int8" and spec.quantizer.weight_dtype == "int16" and spec.quantizer.mixed


def test_dtype_misplaced_in_calibration_table_is_rejected(tmp_path):
    # a user writing `dtype` under [calibration] gets an error, not a silent default
    (entry,) = load_models(write(tmp_path, "m", BASE + '[calibration]\ndtype = "int16"\n'))
    assert isinstance(entry, InvalidModel) and "unknown key(s) ['dtype']" in str(entry.error)


def test_one_bad_entry_does_not_hide_the_others(tmp_path):
    d = write(tmp_path, "good", BASE)
    write(tmp_path, "bad", 'dtype = "fp8"\n' + BASE)
    kinds = {e.name: type(e).__name__ for e in load_models(d)}
    assert kinds == {"bad": "InvalidModel", "good": "ModelSpec"}


def test_extends_overrides_and_reports_unknown_base(tmp_path):
    d = write(tmp_path, "base", BASE)
    write(tmp_path, "v16", 'extends = "base"\ndtype = "int16"\n[calibration]\nnum_images = 5\n')
    write(tmp_path, "orphan", 'extends = "nope"\n')
    e = {x.name: x for x in load_models(d)}
    assert e["v16"].dtype == "int16" and e["v16"].calibration.num_images == 5
    assert e["v16"].builder == e["base"].builder
    assert isinstance(e["orphan"], InvalidModel) and "extends unknown model 'nope'" in str(e["orphan"].error)


def test_extends_replaces_the_weights_table_as_a_whole(tmp_path):
    """A variant naming its own checkpoint must not inherit the base's package or file."""
    base = BASE + 'package = "pkg"\npackage_path = "w/m-b0353104.pth"\n'
    d = write(tmp_path, "base", base)
    write(tmp_path, "mine", 'extends = "base"\n[weights]\npath = "ckpt/mine.pth"\n')
    e = {x.name: x for x in load_models(d)}
    assert e["mine"].weights.path == "ckpt/mine.pth"
    assert e["mine"].weights.file is None and e["mine"].weights.package is None


def test_profile_board_log_is_optional_validated_and_not_inherited(tmp_path):
    d = write(tmp_path, "plain", BASE)
    write(tmp_path, "board", BASE + '[profile]\nboard_log = "logs/c7x.txt"\n')
    write(tmp_path, "variant", 'extends = "board"\ndtype = "int16"\n')
    write(tmp_path, "bad_type", BASE + "[profile]\nboard_log = 3\n")
    write(tmp_path, "bad_empty", BASE + '[profile]\nboard_log = " "\n')
    write(tmp_path, "bad_key", BASE + '[profile]\nlog = "x"\n')
    e = {x.name: x for x in load_models(d)}
    assert e["plain"].profile.board_log is None
    assert e["board"].profile.board_log == "logs/c7x.txt"
    assert e["variant"].profile.board_log is None  # the base's log was printed by the base's build
    for name in ("bad_type", "bad_empty"):
        assert isinstance(e[name], InvalidModel), name
        assert "profile.board_log must be the path of a text file" in str(e[name].error)
        assert f"{name}.toml" in str(e[name].error)
    assert "unknown key(s) ['log'] in [profile]" in str(e["bad_key"].error)


def test_an_accuracy_target_is_parsed_and_makes_the_entry_mixed_only_with_int16(tmp_path):
    text = BASE + '[quantizer]\ntarget = { metric = "logit_error", max = 0.2, int16 = true, max_mcycles = 6 }\n'
    (spec,) = load_models(write(tmp_path, "m", text))
    t = spec.quantizer.target
    assert (t.metric, t.bound, t.int16, t.max_mcycles, t.sense) == ("logit_error", 0.2, True, 6.0, "max")
    assert spec.quantizer.mixed and t.text() == "logit_error <= 0.2 within 6M est. cycles"
    assert t.met_by(0.2) and not t.met_by(0.21) and not t.met_by(None)
    assert t.within(6_000_000) and not t.within(6_000_001)
    (plain,) = load_models(write(tmp_path, "m", BASE + '[quantizer]\ntarget = { metric = "top1_agreement", min = 0.9 }\n'))
    assert not plain.quantizer.mixed and plain.quantizer.target.met_by(0.95)
    # int16 weights with the entry's own int16 layers are not the int8-only search's to choose
    (own,) = load_models(write(tmp_path, "m", BASE + '[quantizer]\ntarget = { metric = "top1_agreement", min = 0.9 }\n'
                                                    'weight_dtype = "int16"\nint16_layers = ["features.0.*"]\n'))
    assert own.quantizer.weight_dtype == "int16" and own.quantizer.int16_layers == ("features.0.*",)
    write(tmp_path, "v", 'extends = "m"\n[quantizer]\ntarget = false\n')   # a variant opts out
    variant = next(e for e in load_models(tmp_path / "models") if e.name == "v")
    assert variant.quantizer.target is None


def test_a_detection_target_can_hold_every_image_to_a_floor(tmp_path):
    text = ('task = "detection"\n' + BASE +
            '[quantizer]\ntarget = { metric = "detections_matched", min = 0.9, per_image = 0.75 }\n')
    (spec,) = load_models(write(tmp_path, "d", text))
    t = spec.quantizer.target
    assert t.per_image == 0.75 and t.text() == "detections_matched >= 0.9 and >= 0.75 on every image with >= 3 detections"
    assert t.met_by(0.95, 0.8) and t.met_by(0.95, None) and not t.met_by(0.95, 0.67) and not t.met_by(0.85, 0.9)
    assert type(t).from_record(t.to_record()) == t

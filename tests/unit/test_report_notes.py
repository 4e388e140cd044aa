"""The accuracy report says when its numbers are not what they seem."""

from pipeline.stages.evaluate import report_notes

CAL = {"source": "images", "images": ["a_1.jpg", "b_2.jpg"]}
EXP = {"pretrained": True}


def test_overlap_between_calibration_and_evaluation_is_counted():
    notes = report_notes(CAL, EXP, ["a_1.jpg", "b_2.jpg", "c_3.jpg"], [1, 2, 3], classes=10)
    assert notes == ["2 of the 3 evaluation images were also calibration images: their numbers (in-sample) "
                     "measure quantization fidelity, not held-out accuracy; holdout.json has the k-fold estimate"]
    assert report_notes(CAL, EXP, ["x_1.jpg"], [1], classes=10) == []


def test_random_calibration_and_random_weights_are_not_for_deployment():
    notes = report_notes({"source": "random", "images": []}, {"pretrained": False}, ["x_1.jpg"], [1], 10)
    assert any("calibrated on random noise" in n for n in notes)
    assert any("random-init weights" in n for n in notes)


def test_labels_beyond_the_model_classes_are_flagged():
    notes = report_notes(CAL, EXP, ["x_990.jpg", "y_3.jpg", "z.jpg"], [990, 3, None], classes=10)
    assert notes == ["1 labels are outside the model's 10 classes: those images count for agreement with float only"]

"""doit entry point: every model under models/ through the C7x flow.

`doit` builds all models and prints the summary; `doit list --all` shows each
stage of each model (e.g. calibrate:mobilenet_v2). The wiring lives in the
`pipeline` package, so other projects can use it from their own dodo file.
"""

from pipeline.tasks import load_project

globals().update(load_project(models_dir="models", artifacts_dir="artifacts", calib_root="calib_data"))

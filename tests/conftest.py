"""Shared test set-up: make ``tests/`` importable (for ``qflow``) and keep torch small."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("C7X_TORCH_THREADS", "2")

# The explicit set-up every stage process makes (pipeline.torchenv.setup: threads, quiet
# torchao, the Q/DQ ops registered): tests call stage functions and libraries directly.
from pipeline import torchenv  # noqa: E402

torchenv.setup()

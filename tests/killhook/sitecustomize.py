"""Test hook: simulate a process killed while writing an artifact.

Active only when C7X_TEST_KILL_ON_SAVE names a file stem: the first torch.save
to a path containing it writes part of the data, then the process SIGKILLs
itself (no cleanup handlers run, exactly like an OOM kill or `kill -9`).
"""

import os

_stem = os.environ.get("C7X_TEST_KILL_ON_SAVE")
if _stem:
    import signal

    import torch

    _orig = torch.save

    def _save(obj, f, *args, **kwargs):
        if _stem in str(f):
            _orig(obj, f, *args, **kwargs)
            size = os.path.getsize(f)
            with open(f, "r+b") as fh:
                fh.truncate(size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        return _orig(obj, f, *args, **kwargs)

    torch.save = _save

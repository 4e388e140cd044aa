"""Test hook: simulate a process killed while writing an artifact.

Active only when C7X_TEST_KILL_ON_SAVE names part of an artifact path: the
first atomic write of such a file puts half of its bytes into the temporary
file, then the process SIGKILLs itself (no cleanup handlers run, exactly like
an OOM kill or `kill -9`).
"""

import os

_needle = os.environ.get("C7X_TEST_KILL_ON_SAVE")
if _needle:
    import signal

    import pipeline.fsutil as _fs

    _orig = _fs.write_bytes

    def _write_bytes(target, data):
        if _needle in str(target):
            with _fs.atomic_path(target) as tmp:
                tmp.write_bytes(data[: len(data) // 2])
                os.kill(os.getpid(), signal.SIGKILL)
        return _orig(target, data)

    _fs.write_bytes = _write_bytes

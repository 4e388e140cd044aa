"""Errors the pipeline raises on bad input.

Every error names what was wrong, where (file, model) and what to do. The doit
layer turns them into a one-line task failure instead of a traceback.
"""


class PipelineError(Exception):
    """Base class: a problem with the user's input or environment, not a bug."""


class ConfigError(PipelineError):
    """A model entry (``models/*.toml``) is invalid."""


class WeightsNotFoundError(PipelineError):
    """No checkpoint file was found for a model."""


class CalibrationDataError(PipelineError):
    """A calibration image set is missing, empty or holds an unreadable file."""


class UnsupportedOpError(PipelineError):
    """The graph holds an operator the backend cannot lower."""


class ToolchainError(PipelineError):
    """An external tool (TI cl7x, gcc) is missing or failed."""


class StaleArtifactError(PipelineError):
    """An artifact disagrees with the artifacts it was made from (edited by hand, or
    left from another run): re-running the stage the message names fixes it."""


class ExecutorError(PipelineError):
    """The Dask executor (``DOIT_C7X_EXECUTOR``) is misconfigured or unreachable, or
    lost a stage's worker; nothing the stage wrote is trusted (see :mod:`pipeline.executor`)."""


def brief(e: BaseException) -> str:
    """``Type: first line`` of an exception (just the type when its message is empty),
    for one-line errors that wrap another library's exception."""
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:160]}" if lines else type(e).__name__

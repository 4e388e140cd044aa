"""The doit layer: stage records (:mod:`pipeline.stages.registry`) -> doit tasks.

Only wiring lives here: :mod:`.project` builds one sub-task per model and
stage from the registry, :mod:`.actions` holds the functions doit runs.
Loading the task list imports neither torch nor tvm.
"""

from .project import Project, load_project

__all__ = ["Project", "load_project"]

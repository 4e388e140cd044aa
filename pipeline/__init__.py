"""doit-c7x: a doit plugin taking PyTorch models through the TI C7x NPU flow.

Use from a dodo file::

    from pipeline.tasks import load_project
    globals().update(load_project("models"))

Importing this package (and ``pipeline.tasks``) never imports torch or tvm;
the stage modules do, when a task runs.
"""

__version__ = "0.1.0"

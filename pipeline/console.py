"""doit console reporter: doit's usual lines, then the project summary.

The summary is printed at the end of every run that asked for it (the default
run), also when everything was up to date or when some model failed: the
models that built are reported and each failed model gets one line naming its
failed stage and the error. A run without the summary (``doit verify:m``)
prints those lines alone. doit's own failure blocks are not printed: a stage's
error is one self-contained line (its traceback, if any, is in
``artifacts/<model>/logs/``), and the stages it blocked (doit's
``UnmetDependency``) add nothing to it. No torch, no tvm.
"""

from __future__ import annotations

from doit.exceptions import UnmetDependency
from doit.reporter import ConsoleReporter

from .stages.summary import render, restored_lines


class C7xReporter(ConsoleReporter):
    """ConsoleReporter + summary. ``payloads`` (set by :meth:`Project.doit_config`): what
    :func:`pipeline.stages.summary.render` needs for the ``summary`` task and each group task;
    the first of them selected on the command line (or by default) is printed at the end."""

    desc = "console output with the doit-c7x summary"
    payloads: dict[str, dict] = {}   # task name ("summary" or a group's) -> its summary payload

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.payload: dict = {}
        self.failed: dict[str, str] = {}
        self.restored: list[str] = []  # tasks whose outputs came from the run-cache

    def initialize(self, tasks, selected_tasks):
        shown = [t for t in (selected_tasks or []) if t in self.payloads]
        self.payload = self.payloads[shown[0]] if shown else {}

    def add_success(self, task):
        super().add_success(task)
        if (task.values or {}).get("run_cache") == "restored":
            self.restored.append(task.name)

    def add_failure(self, task, fail):
        if isinstance(fail, UnmetDependency):
            return  # blocked by a failure reported on its own line
        stage, _, model = task.name.partition(":")
        lines = fail.get_msg().strip().splitlines()
        msg = lines[-1] if lines else type(fail).__name__
        if not model:  # the summary or cache task: no model line will carry it
            self.write(f"{task.name}: FAILED: {msg}\n")
        elif model not in self.failed:  # the first failure of a model is its cause
            self.failed[model] = msg if msg.startswith(stage + ": ") else f"{stage}: {msg}"
        self.failures.append({"task": task, "exception": fail})  # doit's exit code counts them

    def complete_run(self):
        self.failures, failures = [], self.failures  # printed below as one line per model instead
        super().complete_run()
        self.failures = failures
        if self.payload:
            self.write(render(self.payload, self.failed, self.restored) + "\n")
            return
        for model, why in self.failed.items():
            self.write(f"{model}: FAILED at {why}\n")
        if self.restored:  # e.g. `doit verify:m`: no summary, still say what was restored
            self.write("\n".join(restored_lines(self.restored)) + "\n")

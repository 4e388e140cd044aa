"""doit console reporter: doit's usual lines, then the project summary.

The summary is printed at the end of every run that asked for it (the default
run), also when everything was up to date or when some model failed: the
models that built are reported and each failed model gets one line naming its
failed stage and the error. No torch, no tvm.
"""

from __future__ import annotations

from doit.reporter import ConsoleReporter

from .stages.summary import render, restored_lines


class C7xReporter(ConsoleReporter):
    """ConsoleReporter + summary. ``payload`` (set by :meth:`Project.doit_config`)
    is what :func:`pipeline.stages.summary.render` needs."""

    desc = "console output with the doit-c7x summary"
    payload: dict = {}

    def __init__(self, outstream, options):
        super().__init__(outstream, options)
        self.show_summary = False
        self.failed: dict[str, str] = {}
        self.restored: list[str] = []  # tasks whose outputs came from the run-cache

    def initialize(self, tasks, selected_tasks):
        self.show_summary = "summary" in (selected_tasks or [])

    def add_success(self, task):
        super().add_success(task)
        if (task.values or {}).get("run_cache") == "restored":
            self.restored.append(task.name)

    def add_failure(self, task, fail):
        super().add_failure(task, fail)
        stage, _, model = task.name.partition(":")
        if model and model not in self.failed:
            self.failed[model] = f"{stage}: {fail.get_msg().strip().splitlines()[-1]}"

    def complete_run(self):
        # doit's own epilogue, minus the empty "<task> <stdout>:" blocks
        # python-action failures produce (their message is already shown)
        self.failures = [f for f in self.failures if _captured(f["task"])]
        super().complete_run()
        if self.show_summary and self.payload:
            self.write(render(self.payload, self.failed, self.restored) + "\n")
        elif self.restored:  # e.g. `doit verify:m`: no summary, still say what was restored
            self.write("\n".join(restored_lines(self.restored)) + "\n")


def _captured(task) -> bool:
    return any((a.out or "").strip() or (a.err or "").strip() for a in task.actions)

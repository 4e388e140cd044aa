"""``doit dumpdb`` for a doit-c7x project: doit's own command, read where our runs keep the DB.

doit's ``dumpdb`` does not load the dodo file, so it never sees ``DOIT_CONFIG``'s
``dep_file`` (``artifacts/.doit.db``); ``pyproject.toml`` gives it that path
(``[tool.doit.commands.dumpdb]``) and registers this class under the same name
(``[tool.doit.plugins.COMMAND]``). Before reading, it says in one line why there
is nothing safe to read: a build is running (it holds the DB and rewrites it;
reading it then gave a ``dbm.error`` traceback), or no build has written one yet.
"""

from __future__ import annotations

from pathlib import Path

from doit.cmd_dumpdb import DumpDB as DoitDumpDB
from doit.exceptions import InvalidCommand

from . import lock


class DumpDB(DoitDumpDB):
    """doit's ``dumpdb``, with one line instead of a ``dbm.error`` traceback."""

    def execute(self, opt_values, pos_args):
        dep_file = Path(opt_values["dep_file"])
        holder = lock.other_holder(dep_file.parent)
        if holder:
            raise InvalidCommand(f"a doit run ({holder}) is building this project and holds its state "
                                 f"database {dep_file}; run dumpdb again when it ends")
        if not any(dep_file.parent.glob(dep_file.name + "*")):
            raise InvalidCommand(f"no state database at {dep_file}: no doit run has finished in this "
                                 f"project yet (or give another one with --db-file)")
        return super().execute(opt_values, pos_args)

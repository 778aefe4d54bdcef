"""The one loader of the launcher's code in the user's interpreter, where the launcher itself may
not be importable. A runner the launcher starts by path (a framework's ``run.py``) puts this folder
first on ``sys.path`` for one import of this module, whose name no program's module has, and takes
:data:`program` from it; everything else it loads through that (``program.load_sibling``,
``program.core``, ``program.records``), each under a private name.

Stdlib only; its Python floor is in ruff.toml, as for all of runner/.
"""

import importlib.util
import os
import sys

_NAME = "_trainer_launcher_program"

if _NAME in sys.modules:
    program = sys.modules[_NAME]
else:
    _spec = importlib.util.spec_from_file_location(_NAME, os.path.join(os.path.dirname(__file__), "program.py"))
    if _spec is None or _spec.loader is None:
        raise ImportError(f"cannot load program.py beside {__file__}", name=_NAME)
    program = importlib.util.module_from_spec(_spec)
    sys.modules[_NAME] = program  # before it runs: its dataclasses look their module up
    try:
        _spec.loader.exec_module(program)
    except BaseException:
        del sys.modules[_NAME]
        raise

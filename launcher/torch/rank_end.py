"""What every torch rank is given so that a finished program ends cleanly: the directory of
``_trainer_launcher_torch_end`` (launcher/torch/hook) on its PYTHONPATH, behind the runner hook's
sitecustomize that imports it (torch issue 117762; docs/frameworks/torch.md)."""

from __future__ import annotations

import os

from launcher.status import stacks

HOOK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hook")
MODULE = "_trainer_launcher_torch_end"


def rank_env(watched: dict[str, str]) -> dict[str, str]:
    """The ranks' PYTHONPATH (the watch's, when it set one: its hook is kept first) with ours, and
    the variable that has the sitecustomize import our module."""
    from launcher.core import settings  # pydantic: loaded by now (the plan is made), not at import

    pythonpath = watched.get("PYTHONPATH", settings.environ().get("PYTHONPATH"))
    return {"PYTHONPATH": stacks.hook_path(pythonpath, HOOK_DIR), stacks.RANK_HOOKS_ENV: MODULE}

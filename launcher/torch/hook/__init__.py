"""The directory put on torch ranks' PYTHONPATH, beside launcher/runner/hook (whose sitecustomize
imports what :data:`launcher.status.stacks.RANK_HOOKS_ENV` names): it holds only
``_trainer_launcher_torch_end``. (A package only so that it is installed.)"""

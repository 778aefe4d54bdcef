"""``trainer-launcher jax``: how the CLI reaches this package (nothing heavy imported here)."""

from launcher.core.runner_command import RunnerCommand
from launcher.jax.knobs import JAX_KNOBS

COMMAND = RunnerCommand(
    "jax",
    JAX_KNOBS,
    help="run a JAX program from the JAX_* environment (one process per pod), supervised",
    usage="trainer-launcher jax [OPTIONS] -- PROGRAM [ARGS...]   (e.g. -- python train.py)",
)

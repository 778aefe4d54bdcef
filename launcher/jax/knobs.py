"""The JAX role's knobs: LAUNCHER_* variables, each also a flag. Pydantic-free, like launcher.core.knobs."""

from __future__ import annotations

from launcher.core.knobs import Knob

JAX_KNOBS: dict[str, Knob] = {
    "initialize": Knob(
        "LAUNCHER_JAX_INITIALIZE",
        "--jax-initialize",
        "1 (default): run a Python program through launcher.jax.run, which calls jax.distributed.initialize() "
        "from JAX_* before the program (the program's own call then does nothing); 0: run the program as given",
    ),
}

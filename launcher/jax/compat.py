"""jax beyond its public API, each use behind a feature check: the one place the JAX runner
(run.py) reaches into jax's internals.

The runner runs in the user's interpreter, by path, so this module is the standard library only,
imports jax only inside its hooks (after the runner has imported it) and is loaded by path as
well (``run.load_sibling``, under a name of its own: a program may have a ``compat`` module).
Verified on jax 0.5.3, 0.7.2 and 0.10.2 (tests/test_matrix_jax.py runs each).

| hook               | relies on                                            | without it                               |
| coordination_store | ``jax._src.distributed.global_state.client``, the    | no stop records: each process still      |
|                    | coordination service's client, and its               | exits with its program's code, but a     |
|                    | ``key_value_set``, ``blocking_key_value_get``,       | peer's failure reaches the others only   |
|                    | ``key_value_dir_get``, ``wait_at_barrier`` (and      | through JAX's own error polling, and     |
|                    | ``key_value_try_get``, else a 1 ms blocking get)     | each pod names itself, not the root cause|
| cpu_collectives    | the option ``jax_cpu_collectives_implementation``    | JAX_CPU_COLLECTIVES_IMPLEMENTATION, set  |
|                    | (jax reads the variable at import, before the        | after the import by the launcher's word, |
|                    | launcher's word: it is set again through the config) | is not applied                           |
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING or __package__:  # imported as the launcher's package (and as a type checker reads it)
    from launcher.core import versions
else:  # loaded by path, as the runner beside it is: the launcher's files through the one loader
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "runner"))
    from _trainer_launcher_load import program

    del sys.path[0]
    versions = program.core("versions")

# What a stop record needs of the coordination client; key_value_try_get is optional.
_STORE_METHODS = ("key_value_set", "blocking_key_value_get", "key_value_dir_get", "wait_at_barrier")
notes = versions.FeatureNotes("jax")  # each said once
feature_off = notes.off


class Store:
    """The coordination service's key-value store and barriers, as the runner uses them."""

    def __init__(self, client):
        self._client = client
        self._try_get = getattr(client, "key_value_try_get", None)

    def get(self, key: str, timeout_ms: int) -> str:
        """The value, once set; raises on timeout (DEADLINE_EXCEEDED) or a store that is gone."""
        return self._client.blocking_key_value_get(key, timeout_ms)

    def try_get(self, key: str) -> str | None:
        try:
            if self._try_get is not None:
                return self._try_get(key)
            return self._client.blocking_key_value_get(key, 1)
        except Exception:  # noqa: BLE001 - not there (NOT_FOUND, DEADLINE_EXCEEDED), or no store
            return None

    def set(self, key: str, value: str, overwrite: bool) -> None:
        """Raises when the key exists and ``overwrite`` is false: the first writer wins."""
        self._client.key_value_set(key, value, allow_overwrite=overwrite)

    def claim(self, key: str, value: str) -> str:
        """The stop record's transport (launcher/runner/report.py): ``value`` unless the key holds
        one already; the value it holds afterwards."""
        try:
            self.set(key, value, overwrite=False)
            return value
        except Exception:  # noqa: BLE001 - another process set it first (ALREADY_EXISTS)
            held = self.try_get(key)
            return value if held is None else held

    def dir_get(self, prefix: str) -> list:
        return self._client.key_value_dir_get(prefix)

    def barrier(self, name: str, timeout_ms: int) -> None:
        self._client.wait_at_barrier(name, timeout_ms)


def coordination_store() -> Store | None:
    """The store of the coordination service ``jax.distributed.initialize()`` joined; None (said
    once) where this jax keeps its client elsewhere or lacks a method the stop records need."""
    feature = "stop records (every pod naming the process that failed first)"
    try:
        from jax._src import distributed as internals

        client = internals.global_state.client
    except (ImportError, AttributeError) as error:
        feature_off(
            feature,
            f"jax._src.distributed.global_state.client is not there ({error}); each process "
            "exits with its own code and names itself",
        )
        return None
    if client is None:
        feature_off(
            feature,
            "jax.distributed.initialize() left no coordination client in "
            "jax._src.distributed.global_state; each process exits with its own code and names itself",
        )
        return None
    missing = [name for name in _STORE_METHODS if not callable(getattr(client, name, None))]
    if missing:
        feature_off(
            feature,
            f"jax's coordination client has no {', '.join(missing)}; each process exits with its "
            "own code and names itself",
        )
        return None
    return Store(client)


def cpu_collectives(jax, value: str) -> None:
    """Apply JAX_CPU_COLLECTIVES_IMPLEMENTATION, which jax read at import, before the launcher's
    word set it. A value jax refuses is left for jax to report where it uses it."""
    try:
        jax.config.update("jax_cpu_collectives_implementation", value)
    except (AttributeError, KeyError) as error:  # no such option in this jax
        feature_off(
            f"JAX_CPU_COLLECTIVES_IMPLEMENTATION={value}",
            f"this jax has no jax_cpu_collectives_implementation option ({error})",
        )
    except Exception:  # noqa: BLE001 - a value it refuses: its own error later
        pass

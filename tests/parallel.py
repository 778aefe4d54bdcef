"""How the suite shares this machine when pytest-xdist runs it in several worker processes (``-n``,
as .ci/run does): each worker has its own session, so its own servers (moto, the hub and status
stand-ins) on ports of their own. What is the machine's alone is kept to one worker, whose tests
then run one after another:

- ``containers``: every test that uses the container engine (buildah and podman's storage, the
  pods' network with its fixed addresses, the SDK's podman service, images built once a session);
- ``smoke``: the preflight's tests, which find their ranks among the machine's processes;
- ``matrix-torch-X``: the compatibility matrix's tests on one cached torch (``_matrix_torch``).
"""

from __future__ import annotations

import pytest

SMOKE = ("test_smoke",)


def group_of(item: pytest.Item) -> str | None:
    if "engine" in getattr(item, "fixturenames", ()):
        return "containers"
    if (torch := _matrix_torch(item)) is not None:
        return torch
    module = getattr(item, "module", None)
    if module is not None and module.__name__.rsplit(".", 1)[-1].startswith(SMOKE):
        return "smoke"
    return None


def _matrix_torch(item: pytest.Item) -> str | None:
    """The cached torch environment a matrix test runs in (accelerate's stand on one), if any:
    its tests run one after another in one worker. A CUDA build's libraries are gigabytes that
    ``import torch`` reads from disk when the page cache lost them (13 s against 2.4 s warm, for
    2.15.0), which the image builds beside them make likely; run together, each column reads
    them once."""
    from matrix_envs import ENVS

    param = getattr(getattr(item, "callspec", None), "params", {}).get("python")
    env = ENVS.get(param[0]) if isinstance(param, tuple) else None
    while env is not None and env.base is not None:
        env = ENVS[env.base]
    return f"matrix-{env.name}" if env is not None and env.framework == "torch" else None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

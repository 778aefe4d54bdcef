"""How the suite shares this machine when pytest-xdist runs it in several worker processes (``-n``,
as .ci/run does): each worker has its own session, so its own servers (moto, the hub and status
stand-ins) on ports of their own. What is the machine's alone is kept to one worker, whose tests
then run one after another:

- ``containers``: every test that uses the container engine (buildah and podman's storage, the
  pods' network with its fixed addresses, the SDK's podman service, images built once a session);
- ``smoke``: the preflight's tests, which find their ranks among the machine's processes.
"""

from __future__ import annotations

import pytest

SMOKE = ("test_smoke",)


def group_of(item: pytest.Item) -> str | None:
    if "engine" in getattr(item, "fixturenames", ()):
        return "containers"
    module = getattr(item, "module", None)
    if module is not None and module.__name__.rsplit(".", 1)[-1].startswith(SMOKE):
        return "smoke"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))

"""The export's settings: its knobs, and the storage credentials as the initializers take them."""

from __future__ import annotations

import functools
from typing import Annotated

from pydantic_settings import NoDecode

from launcher.core.settings import field, int_in, knob_field, parse_bool, parsed
from launcher.export.knobs import EXPORT_KNOBS
from launcher.initializers.settings import S3Settings

_export_knob = functools.partial(knob_field, EXPORT_KNOBS)


class ExportSettings(S3Settings):
    """The export's knobs; the S3 credentials are the initializers' (S3Settings)."""

    export_uri: str | None = _export_knob("export_uri", None)
    export_path: str = _export_knob("export_path", "/workspace/output")
    export_per_node: Annotated[bool, NoDecode, parsed(parse_bool)] = _export_knob("export_per_node", False)
    export_on_failure: Annotated[bool, NoDecode, parsed(parse_bool)] = _export_knob("export_on_failure", False)
    export_concurrency: Annotated[int, NoDecode, parsed(int_in(1, 256, "a number of parallel uploads"))] = _export_knob(
        "export_concurrency", 8
    )
    # Which node this pod is: the Job's completion index, as Trainer gives every pod.
    node_index: Annotated[int, NoDecode, parsed(int_in(0, 1 << 20, "a node index"))] = field(
        ("JOB_COMPLETION_INDEX", "PET_NODE_RANK"), 0, "this pod's node index"
    )
    access_token: str | None = field(("ACCESS_TOKEN", "HF_TOKEN"), None, "hf: token", secret=True)

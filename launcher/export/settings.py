"""The export's settings: its knobs, and the storage credentials as the initializers take them."""

from __future__ import annotations

import functools
from typing import Annotated

from pydantic_settings import NoDecode

from launcher.core.settings import (
    Settings,
    field,
    int_in,
    knob_field,
    parse_bool,
    parse_url,
    parsed,
)
from launcher.export.knobs import EXPORT_KNOBS

_export_knob = functools.partial(knob_field, EXPORT_KNOBS)


class ExportSettings(Settings):
    export_uri: str | None = _export_knob("export_uri", None)
    export_path: str = _export_knob("export_path", "/workspace/output")
    export_per_node: Annotated[bool, NoDecode, parsed(parse_bool)] = _export_knob("export_per_node", False)
    export_on_failure: Annotated[bool, NoDecode, parsed(parse_bool)] = _export_knob("export_on_failure", False)
    export_concurrency: Annotated[int, NoDecode, parsed(int_in(1, 256, "a number of parallel uploads"))] = (
        _export_knob("export_concurrency", 8))
    # Which node this pod is: the Job's completion index, as Trainer gives every pod.
    node_index: Annotated[int, NoDecode, parsed(int_in(0, 1 << 20, "a node index"))] = field(
        ("JOB_COMPLETION_INDEX", "PET_NODE_RANK"), 0, "this pod's node index")
    # The initializers' names (launcher.initializers.settings), so one secret serves both ways.
    access_token: str | None = field(("ACCESS_TOKEN", "HF_TOKEN"), None, "hf: token", secret=True)
    endpoint: Annotated[str | None, NoDecode, parsed(parse_url)] = field("ENDPOINT", None, "s3: endpoint URL")
    access_key_id: str | None = field("ACCESS_KEY_ID", None, "s3: access key id", secret=True)
    secret_access_key: str | None = field("SECRET_ACCESS_KEY", None, "s3: secret access key", secret=True)
    region: str = field("REGION", "auto", "s3: region")
    role_arn: str | None = field("ROLE_ARN", None, "s3: role to assume")
    ca_bundle: str | None = field("AWS_CA_BUNDLE", None, "s3: a PEM bundle of CAs to trust besides the system's")

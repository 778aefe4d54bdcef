"""The export's knobs: each a variable and a flag of every subcommand that runs a job. Pydantic-free,
like launcher.core.knobs: the command line is parsed before the validation machinery loads."""

from __future__ import annotations

from launcher.core.knobs import Knob

EXPORT_KNOBS: dict[str, Knob] = {
    "export_uri": Knob(
        "EXPORT_URI",
        "--export-uri",
        "after the job succeeds, upload --export-path here before exiting 0: s3://BUCKET/PREFIX, "
        "hf://OWNER/NAME[/SUBFOLDER] or file:///PATH",
    ),
    "export_path": Knob("EXPORT_PATH", "--export-path", "the directory to export; default /workspace/output"),
    "export_per_node": Knob(
        "EXPORT_PER_NODE",
        "--export-per-node",
        "1: every node exports its own directory under node-<index>/ (sharded checkpoints); default 0: node 0 alone",
    ),
    "export_on_failure": Knob(
        "EXPORT_ON_FAILURE",
        "--export-on-failure",
        "1: export after a failed job too (checkpoints to resume from); the job's exit code stays its own",
    ),
    "export_concurrency": Knob("EXPORT_CONCURRENCY", "--export-concurrency", "parallel uploads (default 8)"),
}

"""`python -m pkg.initializers.model` (working directory /app) is `trainer-launcher init model`:
STORAGE_URI into OUTPUT_PATH (default /workspace/model), with the same environment (ACCESS_TOKEN,
IGNORE_PATTERNS, ENDPOINT, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION, ROLE_ARN, LAUNCHER_INIT_*)."""

import sys

from launcher.cli import main

sys.exit(main(["init", "model", *sys.argv[1:]]))

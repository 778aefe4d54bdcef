"""`python -m pkg.initializers.dataset` (working directory /app) is `trainer-launcher init dataset`:
STORAGE_URI into OUTPUT_PATH (default /workspace/dataset), with the same environment (ACCESS_TOKEN,
IGNORE_PATTERNS, ENDPOINT, ACCESS_KEY_ID, SECRET_ACCESS_KEY, REGION, ROLE_ARN, LAUNCHER_INIT_*)."""

import sys

from launcher.cli import main

sys.exit(main(["init", "dataset", *sys.argv[1:]]))

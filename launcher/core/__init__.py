"""The shared spine: settings machinery, supervision, the exit-code table, reporting. Knows no framework."""

"""The launcher as a Kubernetes client of its own pod: JobSet in-place restart (inplace.py) over a
minimal stdlib API client (api.py). Imported only when the feature is on."""

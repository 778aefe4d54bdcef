"""Export after success: the job's output directory (``--export-path``, default /workspace/output)
uploaded to ``--export-uri`` (s3://, hf://, file://) before the pod exits 0; verified, atomic for
readers, resumable. The lifecycle step is :class:`launcher.export.step.Export`."""

"""trainer-launcher: the in-pod side of distributed training on Kubernetes."""

__version__ = "0.1.0"

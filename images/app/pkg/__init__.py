"""The Kubeflow SDK's initializer entry points, in /app of the torch image (see initializers/)."""

"""`python -m pkg.initializers.dataset|model`, run in /app: what the Kubeflow SDK's container
backend runs in its dataset and model initializer images. Here each is a thin entry into
`trainer-launcher init dataset|model`, so the same code runs whichever way the image is used."""

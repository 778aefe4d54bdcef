"""JAX: ``trainer-launcher jax`` runs a program with the env Trainer's JAX policy injects."""

"""torch: torchrun from the PET_* environment, planned, supervised, and failing as one job."""

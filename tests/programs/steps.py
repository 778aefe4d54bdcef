"""Prints `step=N/M loss=...` lines at a steady pace, as a training loop would: STEPS, DELAY."""

import os
import time

steps, delay = int(os.environ.get("STEPS", "14")), float(os.environ.get("DELAY", "0.5"))
for step in range(1, steps + 1):
    time.sleep(delay)
    print(f"step={step}/{steps} loss={1.0 / step:.4f}", flush=True)

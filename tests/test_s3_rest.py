"""The launcher's own S3 listing and HEAD (launcher/initializers/s3_rest.py), used where the keys
are given: its SigV4 signature against botocore's for the same request, and against a real
moto_server that enforces IAM auth and checks every signature (s3_server_auth)."""

from __future__ import annotations

import hashlib
import os
from datetime import UTC, datetime

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from launcher.initializers.errors import PermanentError
from launcher.initializers.s3 import classify
from launcher.initializers.s3_rest import S3Rest, sign

NOW = datetime(2026, 11, 30, 12, 0, 7, tzinfo=UTC)


@pytest.mark.parametrize(("method", "url"), [
    ("GET", "http://127.0.0.1:9000/bucket?list-type=2&prefix=data%2Fsub%2F&encoding-type=url"),
    ("GET", "https://bucket.s3.eu-west-1.amazonaws.com/?list-type=2&prefix=&encoding-type=url"
            "&continuation-token=1%2Bab%2Fcd%3D%3D"),
    ("HEAD", "http://127.0.0.1:9000/bucket/data/a%20b%2Bc/%C3%BCn%C3%AF.bin?partNumber=1"),
    ("HEAD", "https://s3.us-east-1.amazonaws.com/my.bucket/key~with-_.chars?partNumber=1"),
])
@pytest.mark.parametrize("token", [None, "session-token/+="])
def test_the_signature_is_botocores_for_the_same_request(monkeypatch, method, url, token):
    region = "eu-west-1" if "eu-west-1" in url else "us-east-1"
    ours = sign(method, url, region, "AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", NOW, token)
    request = AWSRequest(method=method, url=url, headers={"x-amz-content-sha256": hashlib.sha256(b"").hexdigest()})
    signer = S3SigV4Auth(Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token), "s3", region)
    monkeypatch.setattr("botocore.auth.get_current_datetime", lambda: NOW.replace(tzinfo=None))  # one instant
    signer.add_auth(request)
    assert ours["authorization"] == request.headers["Authorization"]


def _rest(server, bucket: str, secret=None) -> S3Rest:
    return S3Rest(bucket, server.access_key_id, secret or server.secret_access_key, "us-east-1", server.endpoint,
                  None, classify)


def test_with_auth_enforced_the_listing_and_the_part_size_are_answered(s3_server_auth):
    """moto checks each signature here: a listing of keys that need encoding, and a multipart
    object's first part size, both answered. (The server is the session's: a bucket of this test's
    own, so that no other test's keys are listed.)"""
    bucket = s3_server_auth.make_bucket("rest-signed")
    keys = ["data/a b+c.txt", "data/ünï/x", "data/ctl\x01key", "data/%41", "data2/not-below"]
    for key in keys:
        s3_server_auth.put(bucket, key, key.encode())
    s3_server_auth.put_multipart(bucket, "data/big.bin", os.urandom(6 * 1024 * 1024))
    rest = _rest(s3_server_auth, bucket)
    listed = rest.listing("data/")
    assert sorted(key for key, _, _ in listed) == sorted([*keys[:4], "data/big.bin"])
    assert {key: size for key, size, _ in listed}["data/ünï/x"] == len("data/ünï/x".encode())
    assert rest.part_size("data/big.bin") == 5 * 1024 * 1024


def test_a_wrong_secret_is_a_refused_signature_a_permanent_auth_failure(s3_server_auth):
    bucket = s3_server_auth.make_bucket("rest-refused")
    with pytest.raises(PermanentError) as refused:
        _rest(s3_server_auth, bucket, secret="not-the-secret").listing("data/")
    assert refused.value.reason == "AuthFailed" and "SignatureDoesNotMatch" in str(refused.value)
    assert "not-the-secret" not in str(refused.value)


def test_a_listing_of_more_than_a_page_is_whole(s3_server):
    """A reply holds a page of keys (1,000 on S3): the rest come with its continuation token."""
    bucket = s3_server.make_bucket("pages")
    keys = [f"many/{i:02d}" for i in range(7)]
    for key in keys:
        s3_server.put(bucket, key, key.encode())
    rest = S3Rest(bucket, s3_server.access_key_id, s3_server.secret_access_key, "us-east-1", s3_server.endpoint, None,
                  classify)
    assert [key for key, _, _ in rest.listing("many/", page=2)] == keys
    assert [key for key, _, _ in rest.listing("many/", page=7)] == keys

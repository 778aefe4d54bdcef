"""The test environment's installer (tests/install.py) hands uv what pip is configured with."""

from __future__ import annotations

from install import parse_pip_config, uv_options

LISTED = """\
:env:.find-links='{links}'
:env:.cert='{cert}'
global.cert='/nowhere/ca.pem'
global.constraint='{constraints}'
global.extra-index-url='file://{index} file:///nowhere/simple'
global.find-links='/nowhere/wheels'
install.no-compile='1'
"""


def test_pip_variables_win_over_files_and_missing_places_are_left_out(tmp_path):
    links, index = tmp_path / "wheels", tmp_path / "simple"
    links.mkdir()
    index.mkdir()
    cert, constraints = tmp_path / "ca.pem", tmp_path / "constraints.txt"
    cert.write_text("")
    constraints.write_text("torch<=2.14.1\n")
    config = parse_pip_config(LISTED.format(links=links, cert=cert, constraints=constraints, index=index))
    assert config["find-links"] == str(links) and config["cert"] == str(cert)
    assert config["no-compile"] == "1"
    args, env = uv_options(config)
    assert args == ["--index-strategy", "unsafe-best-match", "--find-links", str(links), "--extra-index-url", f"file://{index}",
                    "--constraint", str(constraints)]
    assert env == {"SSL_CERT_FILE": str(cert)}


def test_without_pip_configuration_uv_gets_nothing():
    assert parse_pip_config("") == {}
    assert uv_options({}) == (["--index-strategy", "unsafe-best-match"], {})

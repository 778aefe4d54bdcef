"""The documentation's generated pages are what their generator (tests/docs_pages.py) makes from
the code now, and the pages written by hand name the code as it is: the layout every module of
launcher/, the README only links that the site has too.

In-process (unit tier): the generator reads the checkout and imports the launcher; nothing starts.
tests/test_docs_build.py builds the whole site with mkdocs --strict (broken links, missing pages).
"""

from __future__ import annotations

import re

import docs_pages
import pytest
from conftest import REPO

LAUNCHER = REPO / "launcher"


@pytest.fixture(scope="module")
def made() -> dict:
    return docs_pages.pages()


@pytest.mark.parametrize("page", [*docs_pages.PAGES, "the benchmark results and their plots"])
def test_the_generated_page_is_current(page, made):
    paths = [REPO / page] if page in docs_pages.PAGES else [p for p in made if p.relative_to(REPO).as_posix()
                                                             not in docs_pages.PAGES]
    for path in paths:
        assert path.exists() and path.read_text() == made[path], f"{path.relative_to(REPO)}: {docs_pages.STALE}"


def test_every_reason_has_words_for_the_exit_code_page():
    from launcher.core.reasons import Reasons

    assert sorted(docs_pages.WHAT_TO_DO) == sorted(str(reason) for reason in Reasons.all())


def test_the_exit_code_page_has_a_row_per_reason_with_its_code(made):
    from launcher.core.reasons import Reasons

    page = made[REPO / "docs" / "reference" / "exit-codes.md"].split("## Common codes")[0]
    for reason in Reasons.all():
        rows = [line for line in page.splitlines() if line.startswith("|") and f"| `{reason}` |" in line]
        assert len(rows) == 1, reason
        if reason.code is not None:
            assert rows[0].startswith(f"| {reason.code} |"), rows[0]


def test_the_knob_page_names_every_knob_and_its_flag(made):
    page = made[REPO / "docs" / "reference" / "knobs.md"]
    for table, knobs in docs_pages.knob_tables().items():
        for name, knob in knobs.items():
            row = next((line for line in page.splitlines() if f"| `{knob.env}`" in line), None)
            assert row is not None and f"`{knob.flag}`" in row, f"{table}[{name!r}]: {row}"


def test_the_cli_page_has_every_subcommand_and_option(made):
    page = made[REPO / "docs" / "reference" / "cli.md"]
    for name, sub in docs_pages._subparsers(docs_pages.cli_parser()).items():
        assert f"## trainer-launcher {name}\n" in page
        for action in sub._actions:
            for option in action.option_strings:
                assert option in ("-h", "--help") or f"`{option}" in page or f", {option}" in page, (name, option)


def test_the_pages_say_nothing_of_this_machine(made):
    import os

    home = os.path.expanduser("~")
    for path, text in made.items():
        assert str(REPO) not in text, path
        assert home in ("/", "") or home + "/" not in text, path


def test_the_readme_is_an_entrance():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 250, "README.md is the entrance: the manual lives in docs/"
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)\s]*)?\)", readme):
        if not target.startswith(("http://", "https://")):
            assert target.startswith("docs/") and (REPO / target).is_file(), target


def _layout() -> str:
    page = (REPO / "docs" / "architecture.md").read_text()
    return page.split("## Layout", 1)[1].split("\n    launcher/\n", 1)[1].split("\n    examples/", 1)[0]


def _package_entries(layout: str) -> dict[str, str]:
    """Each package's (or top-level file's) entry in the layout: its lines, by the name it starts with."""
    entries: dict[str, str] = {}
    name = ""
    for line in layout.splitlines():
        start = re.match(r"^ {6}([\w./]+)", line)  # the code block's 4 spaces, then launcher/'s 2
        if start:
            name = start[1]
        entries[name] = entries.get(name, "") + line + "\n"
    return entries


def test_the_layout_names_every_module_of_the_launcher():
    entries = _package_entries(_layout())
    missing = []
    for path in sorted(LAUNCHER.rglob("*.py")):
        relative = path.relative_to(LAUNCHER)
        if len(relative.parts) > 1:
            if path.name == "__init__.py":
                continue  # a package's __init__ is the package
            entry = entries.get(f"{relative.parts[0]}/", "") + entries.get(relative.as_posix(), "")
        else:  # launcher/cli.py, ...: the entries of the top level's files
            entry = "".join(text for name, text in entries.items() if "/" not in name)
        if path.name not in entry and relative.as_posix() not in entry:
            missing.append(relative.as_posix())
    assert not missing, f"docs/architecture.md's layout does not name: {missing}"


def test_every_module_the_layout_names_exists():
    entries = _package_entries(_layout())
    named = []
    for package, text in entries.items():
        base = LAUNCHER / package if package.endswith("/") else LAUNCHER
        for name in re.findall(r"(?<![\w./-])((?:[\w]+/)*[\w]+\.py)\b", text):
            candidates = [base / name, LAUNCHER / name, *base.rglob(name)] if base.is_dir() else [LAUNCHER / name]
            if not any(candidate.is_file() for candidate in candidates):
                named.append(f"{package}: {name}")
    assert not named, f"docs/architecture.md's layout names what is not there: {named}"


def test_a_recorded_benchmark_becomes_a_section_with_its_command_date_machine_table_and_plot(tmp_path, monkeypatch):
    """bench/results.py writes what a benchmark printed; bench_pages renders it (tables, SVG plots)."""
    import xml.etree.ElementTree as ElementTree

    import bench_pages

    sys_path = str(REPO / "bench")
    monkeypatch.syspath_prepend(sys_path)
    import results

    monkeypatch.setattr(results, "RESULTS", str(tmp_path))
    monkeypatch.setattr(bench_pages, "RESULTS", tmp_path)
    monkeypatch.setattr("sys.argv", [str(REPO / "bench" / "bench_failure_propagation.py"), "--repeat", "5"])
    results.record("failure-propagation", "A node fails", ["side", "median s"], [["launcher", "1.734"],
                   ["plain torchrun", "306.039"]], [1],
                   plot={"title": "until every node exited", "unit": "s", "bars": [["launcher", 1.734],
                                                                                    ["torchrun", 306.039]]})
    for mb, ours, theirs in ((265, 300.0, 250.0), (884, 380.0, 320.0)):
        monkeypatch.setattr("sys.argv", [str(REPO / "bench" / "bench_init.py"), "--mb", str(mb)])
        results.record(f"init-mixed-{mb}-s3", f"S3 at {mb} MB", ["measure", "MB/s"], [["ours", str(ours)]], [1],
                       plot={"group": "init-s3-throughput", "title": "S3 MB/s by size", "unit": "MB/s",
                             "xlabel": "MB", "x": mb, "points": {"ours": ours, "s5cmd": theirs}})
    made = bench_pages.pages()
    page = made[bench_pages.PAGE]
    section = page.split("## A node fails\n")[1].split("\n## ")[0]
    assert "`python3 bench/bench_failure_propagation.py --repeat 5`" in section
    assert "UTC; " in section and " CPUs" in section and "Python " in section
    assert "| plain torchrun | 306.039 |" in section and "|---|---:|" in section
    assert "![until every node exited](img/bench-failure-propagation.svg)" in section
    bars = ElementTree.fromstring(made["docs/img/bench-failure-propagation.svg"])
    widths = [float(rect.get("width")) for rect in bars.iter("{http://www.w3.org/2000/svg}rect")]
    assert widths[1] > 100 * widths[0] > 0  # drawn to scale: 306 s against 1.7 s
    line = ElementTree.fromstring(made["docs/img/bench-init-s3-throughput.svg"])
    assert len(list(line.iter("{http://www.w3.org/2000/svg}polyline"))) == 2  # ours and s5cmd, two sizes each
    assert "bench_failure_propagation.py" not in page.split("## Not recorded yet")[-1]
    assert "- `python3 bench/bench_torch.py`" in page

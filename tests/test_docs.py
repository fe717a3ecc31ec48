"""The documentation: the MkDocs site builds with --strict, and its shell examples match the code.

The convention for examples is in tests/support/docs_examples.py: every ```bash/```sh/```shell block of
README.md and docs/ is an example; `<!-- docs-example: gpu|cluster|skip (reason) -->` on the line
before its fence keeps it from being run. Every block's flags are checked here (fast); the
unmarked ones are run on CPU, page by page, by the slow test.
"""

import os
import re
import shutil
import subprocess
import tempfile

import pytest

from tests.support import docs_examples
from tests.support.paths import REPO_ROOT

BLOCKS, MARKER_PROBLEMS = docs_examples.all_blocks()
PAGES = sorted({b.path for b in BLOCKS if b.mark is None})
# A page's examples together; the longest (trained weights: 10 runs) takes about 3 minutes on 2 cores.
BLOCK_TIMEOUT_S = 900


def _mkdocs() -> str | None:
    venv = os.path.join(REPO_ROOT, ".venv", "bin", "mkdocs")
    return venv if os.path.exists(venv) else shutil.which("mkdocs")


@pytest.mark.process
def test_mkdocs_build_strict(tmp_path):
    mkdocs = _mkdocs()
    if mkdocs is None:
        pytest.skip("mkdocs is not installed: `.venv/bin/pip install -r requirements-docs.txt`")
    proc = subprocess.run([mkdocs, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "index.html").exists()


def test_readme_is_a_front_page():
    with open(os.path.join(REPO_ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"


# An issue of the project's tracker, by number ("issue 29", "issue #33", "issues 29"): the
# docs speak to users, who need what a part does, not which issue asked for it.
_ISSUE_NUMBER = re.compile(r"\bissues? ?#?[0-9]+", re.IGNORECASE)


def test_docs_name_no_issue_numbers():
    found = []
    for path in docs_examples.doc_files():
        with open(os.path.join(REPO_ROOT, path), encoding="utf-8") as f:
            found += [f"{path}:{number}: {line.strip()}"
                      for number, line in enumerate(f, 1) if _ISSUE_NUMBER.search(line)]
    assert not found, ("issue numbers in README.md and docs/ (say what it does for the user "
                       "instead):\n" + "\n".join(found))


def test_every_page_is_in_the_nav():
    with open(os.path.join(REPO_ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        nav = f.read()
    pages = [p[len("docs/"):] for p in docs_examples.doc_files() if p.startswith("docs/")]
    missing = [p for p in pages if f": {p}" not in nav]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"


def test_example_markers_are_well_formed():
    assert not MARKER_PROBLEMS, "\n".join(MARKER_PROBLEMS)
    assert BLOCKS, "no shell examples found in README.md and docs/"


@pytest.mark.process  # reads main.py's flags in a fresh process
def test_every_example_uses_flags_the_code_defines():
    problems = []
    for block in BLOCKS:
        problems += docs_examples.check_block(block)
    assert not problems, "documented flags the code does not define:\n" + "\n".join(problems)


@pytest.mark.process  # reads main.py's flags in a fresh process
def test_every_main_flag_has_a_group():
    """paxloom/launch/flags.py's GROUPS make `--help` and the sections of docs/reference/flags.md: a
    flag defined there without a group would be missing from both."""
    ungrouped = docs_examples.code_definitions()["ungrouped"]
    assert not ungrouped, (f"flags of paxloom/launch/flags.py in no group of its GROUPS (add each to "
                           f"one, and to that section of docs/reference/flags.md): {ungrouped}")


@pytest.mark.process  # reads main.py's flags in a fresh process
def test_flags_reference_has_a_section_per_group_with_exactly_its_flags():
    definitions = docs_examples.code_definitions()
    aliases = definitions["aliases"]
    expected = {title: sorted([*group, *(a for a, name in aliases.items() if name in group)])
                for title, group in definitions["groups"].items()}
    with open(os.path.join(REPO_ROOT, "docs", "reference", "flags.md"), encoding="utf-8") as f:
        documented = _flag_table_sections(f.read())
    assert documented == expected, (
        "docs/reference/flags.md's sections (## title, a table of `--flag` rows) must be "
        "paxloom/launch/flags.py's GROUPS, in order, with exactly each group's flags and aliases:\n"
        f"documented: {documented}\nGROUPS:     {expected}")
    assert list(documented) == list(expected), "the sections are not in GROUPS' order"


def _flag_table_sections(markdown: str) -> dict[str, list[str]]:
    """{section title (backticks dropped): the sorted `--flags` of its table's rows}, for the
    `## ` sections whose table has flag rows."""
    sections: dict[str, list[str]] = {}
    title = None
    for line in markdown.splitlines():
        if line.startswith("## "):
            title = line[3:].replace("`", "").strip()
        elif title and (row := re.match(r"\|\s*`--([\w.]+)`\s*\|", line)):
            sections.setdefault(title, []).append(row.group(1))
    return {title: sorted(names) for title, names in sections.items()}


def _block_with(flag: str) -> docs_examples.Block:
    for block in BLOCKS:
        mains = [i for i in docs_examples.invocations(block.text) if i.program == "main.py"]
        if sum(f.startswith(flag + "=") for i in mains for f in i.flags) == 1:
            return block
    raise AssertionError(f"no example passes {flag} to main.py exactly once")


@pytest.mark.process  # reads main.py's flags in a fresh process
def test_flag_check_fails_when_a_documented_flag_is_renamed():
    """The check is not vacuous: rename --job_log_dir in a real example, and exactly that is
    reported. The same for a misspelt hyperparameter and a script's flag."""
    block = _block_with("--job_log_dir")
    assert docs_examples.check_block(block) == []
    renamed = docs_examples.Block(block.path, block.line,
                                  block.text.replace("--job_log_dir=", "--job_dir="))
    problems = docs_examples.check_block(renamed)
    assert len(problems) == 1 and "--job_dir is not a flag of main.py" in problems[0], problems

    misspelt = docs_examples.Block("x.md", 1, "python main.py --fdl_config=experiments.Tiny "
                                              "--fdl.MAX_STEPZ=3 --fdl.MAX_STEPS=3")
    problems = docs_examples.check_block(misspelt)
    assert len(problems) == 1 and "--fdl.MAX_STEPZ" in problems[0], problems

    script = docs_examples.Block("x.md", 1, ".venv/bin/python -m paxloom.tools.export_hf "
                                            "--job_log_dir=runs/a --out=runs/b")
    problems = docs_examples.check_block(script)
    assert len(problems) == 1 and "--out is not a flag of -m paxloom.tools.export_hf" in problems[0]


def test_commands_are_read_as_the_shell_reads_them():
    text = "\n".join([
        "export XLA_FLAGS=--xla_force_host_platform_device_count=8",
        "cat > x.py <<'PY'",
        "python main.py --not_a_flag_in_a_heredoc",
        "PY",
        "XLA_FLAGS= .venv/bin/python main.py --fdl_config=experiments.Tiny \\",
        "    --mode=decode --job_log_dir=$(ls -d runs/tiny-* | tail -1)  # a comment --x",
        "for i in 0 1; do python3 -u main.py --host_idx=$i & done; wait",
    ])
    found = docs_examples.invocations(text)
    assert [i.flags for i in found] == [
        ("--fdl_config=experiments.Tiny", "--mode=decode", "--job_log_dir=SUBST"),
        ("--host_idx=$i",),
    ]
    blocks, problems = docs_examples.parse_blocks(
        "<!-- docs-example: skip -->\n```bash\nls\n```\n<!-- docs-example: gpu -->\n```sh\nls\n```\n"
        "<!-- docs-example: gpuu -->\n```bash\nls\n```\n", "x.md")
    assert [b.mark for b in blocks] == ["skip", "gpu", "gpuu"]
    assert len(problems) == 2  # a skip without a reason, an unknown mark


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_examples_run_on_cpu(page):
    """Every unmarked shell block of `page`, in order, from a copy of the repository whose
    .venv is the clone's, on 8 simulated CPU devices; each must exit 0."""
    blocks = [b for b in BLOCKS if b.path == page and b.mark is None]
    with tempfile.TemporaryDirectory(prefix="paxloom-docs-") as copy:
        docs_examples.copy_repository(copy)
        for block in blocks:
            try:
                proc = docs_examples.run_block(block, copy, BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired as error:
                pytest.fail(f"{block} ran over {BLOCK_TIMEOUT_S} s:\n{error.stdout}\n{error.stderr}")
            assert proc.returncode == 0, (
                f"{block} exited {proc.returncode}:\n{block.text}\n--- output (tail)\n"
                f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")

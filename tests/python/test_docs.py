"""The documentation's commands and links work as written.

README.md and docs/*.md are read; every fenced ```sh/```bash block is split into simple commands
and each one is checked for what can be checked without changing the machine:

- `tierfs SUBCOMMAND …`: `tierfs SUBCOMMAND --help` succeeds, and every `--option` the command
  uses is one that subcommand lists; `tierfs-gpu SUBCOMMAND …` likewise when it is built;
- `cargo … -p PACKAGE … -- SUBCOMMAND`: the package is in the workspace, the subcommand exists;
- a script or file of this repository named by a command (`bash tests/run.sh`,
  `mount-scripts/tierfs-mount.sh`, `install … target/release/tierfs …`) exists;
- the README's test command is the one `.ci/run` runs, and it sets itself up (system packages,
  `.venv`).

Every path of the repository quoted in backticks exists, every relative link resolves to a file
(and a `#fragment` to a heading of it), the README's demo runs as written (with the binary
under test instead of `cargo run`, its temporary folder under the session root), and every field
of a live `.tierfs/stats` is named in docs/STATS.md.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import gen
from conftest import REPO, TIERFS_BIN, fresh_dir, mounted_under

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "tests" / "bench" / "README.md"]
REPO_DIRS = ("core/", "fs/", "tests/", "mount-scripts/", "gpu-side/", "winfs/", "fuzz/", "docs/", ".ci/",
             "packaging/")
GPU_BIN = TIERFS_BIN.parent / "tierfs-gpu"


def _rel(doc: Path) -> str:
    return str(doc.relative_to(REPO))


def shell_blocks(doc: Path) -> list[str]:
    """The fenced ```sh / ```bash blocks of `doc`."""
    return re.findall(r"^```(?:sh|bash|shell)\n(.*?)^```", doc.read_text(), re.S | re.M)


def simple_commands(block: str) -> list[list[str]]:
    """`block` split into simple commands (words), comments and redirections dropped."""
    text = block.replace("\\\n", " ")
    commands = []
    for line in text.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        skip_next = False
        for token in lexer:
            if skip_next:
                skip_next = False
                continue
            if token in (";", "&&", "||", "|", "&"):
                if words:
                    commands.append(words)
                words = []
            elif set(token) <= set("<>&"):
                skip_next = True  # the redirection's target
            else:
                words.append(token)
        if words:
            commands.append(words)
    return commands


def all_commands() -> list[tuple[str, list[str]]]:
    return [(_rel(doc), words) for doc in DOCS for block in shell_blocks(doc)
            for words in simple_commands(block)]


def _strip_prefix(words: list[str]) -> list[str]:
    """Drops `sudo`, `VAR=value` assignments and `sudo`'s own options."""
    while words and (words[0] == "sudo" or re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0])
                     or (words[0].startswith("-") and words[0] in ("-E",))):
        words = words[1:]
    return words


@functools.cache
def help_text(binary: str, subcommand: str) -> str:
    run = subprocess.run([binary, subcommand, "--help"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, f"`{binary} {subcommand} --help` failed: {run.stderr}"
    return run.stdout


def _check_options(binary: str, words: list[str], where: str) -> None:
    subcommand = words[1] if len(words) > 1 else None
    assert subcommand and not subcommand.startswith("-"), f"{where}: {' '.join(words)}: no subcommand"
    text = help_text(binary, subcommand)
    for word in words[2:]:
        if word.startswith("--"):
            option = word.split("=", 1)[0]
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", text), (
                f"{where}: `{' '.join(words)}`: {Path(binary).name} {subcommand} has no {option}")


def _workspace_packages() -> set[str]:
    names = set()
    for manifest in REPO.glob("*/Cargo.toml"):
        m = re.search(r'^\[package\]\s*\nname\s*=\s*"([^"]+)"', manifest.read_text(), re.M)
        if m:
            names.add(m.group(1))
    return names


def _repo_path(word: str) -> Path | None:
    """The file of this repository `word` names, if it names one."""
    if word.startswith(REPO_DIRS) or word.startswith("target/release/"):
        return REPO / word
    return None


def test_docs_have_shell_commands():
    assert shell_blocks(REPO / "README.md"), "README.md has no ```sh block"
    assert len(all_commands()) > 20


@pytest.mark.parametrize("where,words", all_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_command_names_what_exists(where, words, tierfs_bin):
    words = _strip_prefix(words)
    if not words:
        return
    head = words[0]
    if head == "tierfs":
        _check_options(str(tierfs_bin), words, where)
    elif head == "tierfs-gpu":
        if not os.access(GPU_BIN, os.X_OK):
            pytest.skip(f"{GPU_BIN} is not built")
        _check_options(str(GPU_BIN), words, where)
    elif head == "cargo":
        package = None
        if "-p" in words:
            package = words[words.index("-p") + 1]
            assert package in _workspace_packages(), f"{where}: no package {package}"
        if "--" in words:
            rest = words[words.index("--") + 1:]
            assert package == "tierfs", f"{where}: `cargo run … --` of {package}"
            _check_options(str(tierfs_bin), ["tierfs", *rest], where)
    elif head in ("bash", "sh"):
        script = REPO / words[1]
        assert script.is_file(), f"{where}: {words[1]} does not exist"
    elif (path := _repo_path(head)) is not None:
        assert path.is_file() and os.access(path, os.X_OK), f"{where}: {head} is not an executable file"
    # Every file of this repository a command names (install's sources, a script's argument).
    for word in words[1:]:
        path = _repo_path(word)
        if path is not None and not word.startswith("target/release/"):
            assert path.exists(), f"{where}: `{' '.join(words)}` names {word}, which does not exist"
        if word.startswith("target/release/"):
            assert (tierfs_bin.parent / Path(word).name).exists(), f"{where}: {word} is not built"


def inline_commands() -> list[tuple[str, list[str]]]:
    """Commands quoted inline (`sudo .venv/bin/python tests/bench/x.py --reps 3`), with the
    optional parts' brackets dropped."""
    found = []
    for doc in DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
        for span in re.findall(r"`([^`]+)`", text.replace("\n", " ")):
            span = " ".join(span.split()).replace("[", " ").replace("]", " ").replace("…", " ")
            if not re.match(r"(sudo |\.venv/bin/python |TIERFS_\w+=\S* |tierfs [a-z]|bash |cargo )", span):
                continue
            if ": " in span:
                continue  # a message quoted, not a command
            for words in simple_commands(span):
                found.append((_rel(doc), words))
    return found


@pytest.mark.parametrize("where,words", inline_commands(),
                         ids=lambda v: v if isinstance(v, str) else " ".join(v)[:60])
def test_inline_command_names_what_exists(where, words, tierfs_bin):
    """A Python script's options are looked up in its source (its `--help` may need root)."""
    words = _strip_prefix(words)
    if words and re.fullmatch(r"(\.venv/bin/)?python3?", words[0]):
        args = words[1:]
        if args[:2] == ["-m", "pytest"]:
            for word in args[2:]:
                if word.startswith("tests/"):
                    assert (REPO / word.split("::")[0]).exists(), f"{where}: no {word}"
            return
        script = REPO / args[0]
        assert script.is_file(), f"{where}: {args[0]} does not exist"
        source = script.read_text()
        for word in args[1:]:
            if word.startswith("--"):
                option = word.split("=", 1)[0]
                assert f'"{option}"' in source, f"{where}: {args[0]} has no option {option}"
        return
    test_command_names_what_exists(where, words, tierfs_bin)


def test_readme_test_command_sets_itself_up():
    """The README's test command is `.ci/run`'s, and it installs what it needs when missing."""
    commands = [" ".join(words) for where, words in all_commands() if where == "README.md"]
    assert "bash tests/run.sh" in commands
    assert re.search(r"^exec bash tests/run\.sh\b", (REPO / ".ci" / "run").read_text(), re.M)
    run_sh = (REPO / "tests" / "run.sh").read_text()
    assert "bash tests/setup-venv.sh" in run_sh and "bash tests/setup-system.sh" in run_sh
    setup = (REPO / "tests" / "setup-venv.sh").read_text()
    for package in ("numpy", "safetensors", "ml_dtypes", "pytest", "pytest-timeout", "gguf"):
        assert re.search(rf"\b{re.escape(package)}\b", setup), package
    # The demo line tests/run.sh takes from the README.
    demo = subprocess.run(["sed", "-n", r"s/^\(cargo run [^#]* demo\) *#.*/\1/p", "README.md"],
                          cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert demo.startswith("cargo run") and demo.endswith(" demo")


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(doc: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return {_slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def _links(doc: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.S | re.M)
    return re.findall(r"\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_relative_links_resolve(doc):
    broken = []
    for link in _links(doc):
        if re.match(r"[a-z]+:", link):
            continue  # not a relative link
        target, _, fragment = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(f"{link}: no {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
        elif fragment and path.suffix == ".md" and fragment not in _anchors(path):
            broken.append(f"{link}: no heading #{fragment} in {path.name}")
    assert not broken, f"{_rel(doc)}: " + "; ".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=_rel)
def test_quoted_repository_paths_exist(doc):
    """Every `path` of this repository quoted in backticks exists."""
    missing = []
    for quoted in re.findall(r"`([^`\s]+)`", doc.read_text()):
        word = quoted.rstrip(".,:;")
        if not word.startswith(REPO_DIRS) or any(c in word for c in "*{}…"):
            continue
        if not (REPO / word).exists():
            missing.append(word)
    assert not missing, f"{_rel(doc)} names paths that do not exist: {missing}"


def test_readme_demo_runs(tierfs_bin):
    """The README's demo, with the binary under test; its folder under the session root."""
    tmp = fresh_dir("docs-demo")
    run = subprocess.run([str(tierfs_bin), "demo"], env={**os.environ, "TMPDIR": str(tmp)},
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "Every byte read through the mount matched the source file." in run.stdout + run.stderr
    assert not mounted_under(tmp)


def _leaf_paths(value, prefix: str = "") -> list[str]:
    """Dotted paths of every leaf of a JSON document (`files[].mode`)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
    if isinstance(value, list):
        return _leaf_paths(value[0], prefix + "[]") if value else [prefix + "[]"]
    return [prefix]


def test_every_stats_field_is_documented(mount):
    """Every field of a live `.tierfs/stats` (a model file opened and read, so `files[]` has a
    row) is named in docs/STATS.md, within the section it belongs to."""
    src = fresh_dir("docs-stats") / "src"
    src.mkdir()
    gen.write_small(src / "m.safetensors", gen.dit_specs(64, 128, 3), seed=5)
    m = mount(src)
    with open(m.mnt / "m.safetensors", "rb") as f:
        f.read()
    doc = (REPO / "docs" / "STATS.md").read_text()
    spans = re.findall(r"`([^`]+)`", doc)
    missing = []
    for path in _leaf_paths(m.stats()):
        section, leaf = path.split(".")[0], re.sub(r"\[\]$", "", path.split(".")[-1])
        named = any(re.search(rf"(?<![\w]){re.escape(leaf)}(?![\w])", s) for s in spans)
        if not named or f"`{section.removesuffix('[]')}" not in doc:
            missing.append(path)
    assert not missing, f"docs/STATS.md does not name: {missing}"


# The benchmarks whose results folder is not named after a script of tests/bench/.
RESULTS_PRODUCERS = {
    "memory": "tests/python/test_memory.py",
    "stress": "tests/python/test_stress.py",
    "cache_lock": "core/examples/cache_lock_bench.rs",
    "compress": "core/examples/compress_bench.rs",
}


def test_every_results_file_is_in_the_performance_map():
    """Each results file lives in tests/bench/results/<benchmark>/, where <benchmark> is the
    script that produced it, and is listed, with what it holds, in docs/PERFORMANCE.md."""
    bench = REPO / "tests" / "bench"
    stray = [p.name for p in bench.glob("*.md") if p.name != "README.md"] + [p.name for p in bench.glob("*.json")]
    assert not stray, f"results files outside tests/bench/results/<benchmark>/: {stray}"
    links = set(_links(REPO / "docs" / "PERFORMANCE.md"))
    for results in sorted((bench / "results").glob("*/*.md")):
        benchmark = results.parent.name
        producer = RESULTS_PRODUCERS.get(benchmark, f"tests/bench/{benchmark}.py")
        assert (REPO / producer).is_file(), f"{results}: no benchmark {producer} made it"
        rel = results.relative_to(REPO)
        assert f"../{rel}" in links, f"docs/PERFORMANCE.md does not list {rel}"

"""The documentation's examples work: README.md and every page of the site (docs/, less mkdocs.yml's not_in_nav).

Conventions for page authors (a marker is the line right before the opening fence):

* a ```python block runs: a page's python blocks run in order in one namespace, in a fresh temporary directory,
  with torch on one thread; ``<!-- no-test: REASON -->`` before the fence skips one;
* a ```bash block is checked line by line: every ``python -m MODULE [SUBCOMMAND] ... --flag`` (also
  ``python3``, ``.venv/bin/python``, after ``VAR=value`` prefixes, ``timeout ...``, ``&&``, ``;``, ``|``, with
  ``\\`` continuations joined and comments dropped) must name a module that exists, and each ``--flag`` must appear
  in that module's (and subcommand's) ``--help``; ``<!-- no-test: REASON -->`` skips the block;
* a ```bash block after ``<!-- run -->`` is run for real instead: with bash, in a temporary directory shared by the
  page's run blocks, ``.venv/bin`` first on PATH (``python`` is the project's), each block under a time limit;
* ```console and ```text blocks are output and are not checked.

Also: every public name of ``interference`` (its ``__all__``) is on the API reference page, the site builds in
strict mode with every public name of ``interference``, ``probes`` and ``reports`` in its HTML (skipped without
mkdocs, or when the build takes too long: ``.ci/run`` builds it anyway), and no page tells development history.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
PYTHON_TIMEOUT = 300  # seconds for all python blocks of one page
RUN_TIMEOUT = 300  # seconds for one <!-- run --> block
BUILD_TIMEOUT = 60  # the site build is skipped past this
HISTORY = re.compile(r"session|issue [0-9]|tried and dropped", re.IGNORECASE)

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)")
_MARKER = re.compile(r"^\s*<!--\s*(?P<kind>no-test|run)\b(?::\s*(?P<reason>.*?))?\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str  # relative to ROOT
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    marker: str | None  # "no-test", "run" or None
    reason: str = ""


def _not_in_nav() -> set[str]:
    """Pages mkdocs.yml keeps out of the site (``not_in_nav``), as paths relative to ROOT."""
    text = (ROOT / "mkdocs.yml").read_text()
    match = re.search(r"^not_in_nav:\s*\|\s*\n((?:[ \t]+\S.*\n?)*)", text, re.MULTILINE)
    if not match:
        return set()
    return {f"docs/{line.strip().lstrip('/')}" for line in match.group(1).splitlines() if line.strip()}


def pages() -> list[str]:
    skip = _not_in_nav()
    found = ["README.md"] + sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))
    return [p for p in found if p not in skip]


def blocks(page: str) -> list[Block]:
    """The fenced code blocks of ``page``, with the marker on the line before each."""
    lines = (ROOT / page).read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group("indent"), m.group("fence"), m.group("lang").lower()
        start, body = i, []
        i += 1
        while i < len(lines) and not re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", lines[i]):
            line = lines[i]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            i += 1
        i += 1
        marker = _MARKER.match(lines[start - 1]) if start > 0 else None
        out.append(Block(page, start + 1, lang, "\n".join(body) + "\n", marker and marker.group("kind"),
                         (marker and marker.group("reason")) or ""))
    return out


def _with(lang: str, marker: str | None = None) -> list[str]:
    return [p for p in pages() if any(b.lang == lang and b.marker == marker for b in blocks(p))]


# ----------------------------------------------------------------------------------------------- (a) python blocks
def _run_pages(paths: list[str]) -> dict[str, str | None]:
    """Child process: run each page's python blocks in a forked process (torch imported once); page -> error."""
    import signal
    import traceback

    import torch

    torch.set_num_threads(1)
    import interference  # noqa: F401  (imported before the forks: each page's child starts warm)

    results: dict[str, str | None] = {}
    for page in paths:
        code = [b for b in blocks(page) if b.lang == "python" and b.marker != "no-test"]
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the page's own process: its registrations and globals stay there
            os.close(read)
            error = None
            output = tempfile.TemporaryFile("w+")  # what the page prints: shown when it fails
            os.dup2(output.fileno(), 1)
            os.dup2(output.fileno(), 2)
            try:
                os.chdir(tempfile.mkdtemp(prefix="page-", dir=os.getcwd()))
                signal.alarm(PYTHON_TIMEOUT)
                namespace = {"__name__": "__main__"}
                for b in code:
                    exec(compile(b.code, f"{page}:{b.line}", "exec"), namespace)
            except BaseException:  # noqa: BLE001  (report whatever a block raised)
                sys.stdout.flush()
                sys.stderr.flush()
                output.seek(0)
                error = f"{traceback.format_exc(limit=-8)}\noutput (last 3000 characters):\n{output.read()[-3000:]}"
            with os.fdopen(write, "w") as pipe:
                pipe.write(json.dumps(error))
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        _, status = os.waitpid(pid, 0)
        results[page] = json.loads(text) if text else f"the page's process died (wait status {status})"
    return results


@pytest.fixture(scope="module")
def python_results() -> dict[str, str | None]:
    paths = _with("python")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, __file__, *paths], cwd=tmp, env=env, capture_output=True, text=True,
                              timeout=PYTHON_TIMEOUT * max(1, len(paths)))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("page", _with("python"))
def test_python_blocks_run(page: str, python_results: dict[str, str | None]) -> None:
    """Every ```python block of the page runs (in order, one namespace, a temporary directory)."""
    assert python_results[page] is None, f"{page}: a python block failed:\n{python_results[page]}"


# ----------------------------------------------------------------------------------------------- (b) bash blocks
_WRAPPERS = {"timeout": 1, "nohup": 0, "time": 0, "env": 0, "exec": 0, "sudo": 0}


def _commands(code: str) -> list[list[str]]:
    """The simple commands of a bash block: continuations joined, comments dropped, split on ``&&``, ``||``,
    ``;`` and ``|``."""
    joined = re.sub(r"\\\n", " ", code)
    out = []
    for line in joined.splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        try:
            tokens = list(lexer)
        except ValueError as err:
            raise AssertionError(f"cannot parse the shell line {line!r}: {err}") from None
        current: list[str] = []
        for tok in tokens:
            if tok and set(tok) <= set(";&|"):
                if current:
                    out.append(current)
                current = []
            else:
                current.append(tok)
        if current:
            out.append(current)
    return out


def _python_module(cmd: list[str]) -> tuple[str, list[str]] | None:
    """``(module, arguments)`` of a ``python -m MODULE ...`` command, after env-var prefixes and wrappers."""
    i = 0
    while i < len(cmd):
        tok = cmd[i]
        if re.match(r"^[A-Za-z_]\w*=", tok):
            i += 1
        elif tok in _WRAPPERS:
            i += 1
            while i < len(cmd) and cmd[i].startswith("-"):  # the wrapper's own options (timeout -s INT)
                i += 2 if cmd[i] in ("-s", "-k", "--signal", "--kill-after") else 1
            i += _WRAPPERS[tok]
        else:
            break
    if i >= len(cmd) or not re.fullmatch(r"(?:\S*/)?python(?:3(?:\.\d+)?)?", cmd[i]):
        return None
    args = cmd[i + 1:]
    if len(args) < 2 or args[0] != "-m":
        return None
    return args[1], args[2:]


_HELP: dict[tuple[str, str | None, tuple[str, ...]], tuple[int, str]] = {}


def _help_argv(module: str, sub: str | None, imports: tuple[str, ...]) -> list[str]:
    return [*(x for m in imports for x in ("--import", m)), *([sub] if sub else []), "--help"]


def _fetch_help(requests: list[tuple[str, str | None, tuple[str, ...]]]) -> None:
    """Fill the help cache for ``requests`` with one child process (:func:`_serve_help`)."""
    todo = sorted({r for r in requests if r not in _HELP}, key=str)
    if not todo:
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg", "OMP_NUM_THREADS": "1"}
    argvs = [[module, *_help_argv(module, sub, imports)] for module, sub, imports in todo]
    proc = subprocess.run([sys.executable, __file__, "--help-texts"], input=json.dumps(argvs), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120 + 10 * len(todo))
    assert proc.returncode == 0, proc.stderr[-4000:]
    for r, (code, text) in zip(todo, json.loads(proc.stdout.strip().splitlines()[-1])):
        _HELP[r] = (code, text)


def _help(module: str, sub: str | None, imports: tuple[str, ...]) -> tuple[int, str]:
    """Exit status and output of ``python -m module [--import M ...] [sub] --help`` (cached)."""
    _fetch_help([(module, sub, imports)])
    return _HELP[(module, sub, imports)]


def _serve_help(argvs: list[list[str]]) -> list[tuple[int, str]]:
    """Child process: ``python -m MODULE ARGS`` for each ``[MODULE, *ARGS]``, each in a fork of one process that has
    imported the heavy libraries once; ``(exit status, stdout + stderr)`` of each."""
    import runpy

    for lib in ("torch", "numpy", "h5py", "matplotlib.pyplot", "gymnasium", "stable_baselines3"):
        try:
            importlib.import_module(lib)
        except Exception:  # noqa: BLE001  (an optional library: the module's own import will say)
            pass
    out = []
    for module, *args in argvs:
        with tempfile.TemporaryFile("w+") as capture:
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    os.dup2(capture.fileno(), 1)
                    os.dup2(capture.fileno(), 2)
                    sys.argv = [module, *args]
                    runpy.run_module(module, run_name="__main__", alter_sys=True)
                except SystemExit as err:
                    code = err.code if isinstance(err.code, int) else (0 if err.code is None else 1)
                    if not isinstance(err.code, (int, type(None))):
                        print(err.code, file=sys.stderr)
                except BaseException:  # noqa: BLE001
                    import traceback

                    traceback.print_exc()
                    code = 1
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            capture.seek(0)
            out.append((os.waitstatus_to_exitcode(status), capture.read()))
    return out


def _help_requests() -> list[tuple[str, str | None, tuple[str, ...]]]:
    """The --help texts the bash-block checks will ask for (the top level, and each candidate subcommand)."""
    requests = []
    for b in _bash_blocks(None):
        for cmd in _commands(b.code):
            found = _python_module(cmd)
            if not found or not _module_exists(found[0]):
                continue
            module, args = found
            imports = tuple(args[i + 1] for i, a in enumerate(args[:-1]) if a == "--import")
            rest = [a for i, a in enumerate(args) if a != "--import" and (i == 0 or args[i - 1] != "--import")]
            requests.append((module, None, imports))
            if rest and re.fullmatch(r"[A-Z][A-Z0-9_]*", rest[0]):
                requests.append((module, PLACEHOLDER, imports))
            elif rest and not rest[0].startswith("-"):
                requests.append((module, rest[0], imports))
    return requests


PLACEHOLDER = "<SUBCOMMAND>"  # in _help_requests: a CLI whose subcommands a placeholder stands for


@pytest.fixture(scope="module")
def help_texts() -> None:
    """Every --help the bash checks need, fetched in two batches (top levels and subcommands, then the
    subcommands of CLIs a placeholder such as COMMAND stands for)."""
    requests = _help_requests()
    _fetch_help([r for r in requests if r[1] != PLACEHOLDER])
    stand_for = {(m, i) for m, sub, i in requests if sub == PLACEHOLDER}
    _fetch_help([(m, w, i) for m, i in stand_for for w in _candidates(_HELP[(m, None, i)][1])])


def _module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def check_command(module: str, args: list[str]) -> list[str]:
    """Problems of one ``python -m module args`` line: a missing module, flags its ``--help`` does not list."""
    if not _module_exists(module):
        return [f"no module {module!r}"]
    imports = tuple(args[i + 1] for i, a in enumerate(args[:-1]) if a == "--import")
    code, top = _help(module, None, imports)
    if code != 0:
        return [f"python -m {module} --help failed: {top[-500:]}"]
    rest = [a for i, a in enumerate(args) if a != "--import" and (i == 0 or args[i - 1] != "--import")]
    helps, where = [top], ""
    if rest and re.fullmatch(r"[A-Z][A-Z0-9_]*", rest[0]) and _subcommands(module, imports):
        # a placeholder (COMMAND, ALGO) where a subcommand goes: a flag must be one of some subcommand's
        helps += [_help(module, sub, imports)[1] for sub in _subcommands(module, imports)]
        where = " (any subcommand)"
    elif rest and not rest[0].startswith("-"):
        code, sub = _help(module, rest[0], imports)
        if code == 0 and sub != top:  # a subcommand with flags of its own
            helps.append(sub)
            where = f" {rest[0]}"
    text = "\n".join(helps)
    problems = []
    for arg in args:
        if arg.startswith("--") and len(arg) > 2:
            flag = arg.split("=", 1)[0]
            if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", text):
                problems.append(f"{flag} is not in the --help of python -m {module}{where}")
    return problems


@lru_cache(maxsize=None)
def _subcommands(module: str, imports: tuple[str, ...]) -> tuple[str, ...]:
    """The subcommands of an argparse CLI, from its --help: ``{a,b}`` choices or the lines under its positional
    arguments, each confirmed by a --help of its own."""
    top = _help(module, None, imports)[1]
    words = _candidates(top)
    _fetch_help([(module, w, imports) for w in words])
    return tuple(w for w in words if _help(module, w, imports)[0] == 0 and _help(module, w, imports)[1] != top)


def _candidates(top: str) -> list[str]:
    """Words of a --help text that may be subcommands: ``{a,b}`` choices, names listed under positional arguments."""
    words = {w for group in re.findall(r"\{([\w,-]+)\}", top) for w in group.split(",")}
    words |= set(re.findall(r"^ {4}([a-z][\w-]*) {2,}", top, re.MULTILINE))
    return sorted(words)


def _bash_blocks(marker: str | None) -> list[Block]:
    return [b for p in pages() for b in blocks(p) if b.lang in ("bash", "sh", "shell") and b.marker == marker]


@pytest.mark.parametrize("block", _bash_blocks(None), ids=lambda b: f"{b.page}:{b.line}")
def test_bash_commands_exist(block: Block, help_texts: None) -> None:
    """Each ``python -m MODULE`` line of a bash block names a real module and only flags its --help lists."""
    problems = []
    for cmd in _commands(block.code):
        found = _python_module(cmd)
        if found:
            problems += check_command(*found)
    assert not problems, f"{block.page}:{block.line}: " + "; ".join(problems)


def _run_pages_bash() -> list[str]:
    return sorted({b.page for b in _bash_blocks("run")}, key=pages().index)


def _run_page(page: str, directory: str) -> str | None:
    """Run the page's ``<!-- run -->`` blocks in order in ``directory``; the first failure, or None."""
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    env.pop("VIRTUAL_ENV", None)
    for b in [b for b in blocks(page) if b.lang in ("bash", "sh", "shell") and b.marker == "run"]:
        try:
            proc = subprocess.run(["bash", "-eo", "pipefail", "-c", b.code], cwd=directory, env=env,
                                  capture_output=True, text=True, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            return f"{page}:{b.line}: still running after {RUN_TIMEOUT} s\n{b.code}"
        if proc.returncode != 0:
            return (f"{page}:{b.line}: exit {proc.returncode}\n{b.code}\n"
                    f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}")
    return None


@pytest.fixture(scope="module", autouse=True)
def run_results(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """The selected pages' run blocks, started in the background when the module's first test starts (they are
    mostly training runs, which overlap with the other tests here); each page in a directory of its own."""
    selected = {item.callspec.params["page"] for item in request.session.items
                if item.originalname == "test_run_blocks_run" and hasattr(item, "callspec")}
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield {page: pool.submit(_run_page, page, str(tmp_path_factory.mktemp("run")))
               for page in _run_pages_bash() if page in selected}


@pytest.mark.parametrize("page", _run_pages_bash())
def test_run_blocks_run(page: str, run_results: dict[str, Future]) -> None:
    """The page's ``<!-- run -->`` bash blocks run for real, in order, in one temporary directory."""
    error = run_results[page].result()
    assert error is None, error


# ----------------------------------------------------------------------------------------------- (c) API reference
def _directives(page: str) -> list[tuple[str, list[str] | None]]:
    """``(identifier, members or None)`` of every ``::: identifier`` block of a reference page."""
    lines = (ROOT / page).read_text().splitlines()
    out = []
    for i, line in enumerate(lines):
        m = re.match(r"^:::\s+(\S+)", line)
        if not m:
            continue
        members, j, in_members = None, i + 1, False
        while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
            stripped = lines[j].strip()
            if stripped.startswith("members:"):
                in_members, members = True, []
            elif in_members and stripped.startswith("- "):
                members.append(stripped[2:].strip().strip("\"'"))
            elif stripped and not stripped.startswith("- "):
                in_members = False
            j += 1
        out.append((m.group(1), members))
    return out


def test_reference_covers_interference_all() -> None:
    """docs/reference/interference.md renders every name of ``interference.__all__``."""
    import interference

    directives = _directives("docs/reference/interference.md")
    covered = set()
    for ident, members in directives:
        if ident == "interference":
            covered |= set(interference.__all__ if members is None else members)
        elif ident.startswith("interference."):
            covered.add(ident.rsplit(".", 1)[1])
    missing = sorted(set(interference.__all__) - covered)
    assert not missing, f"docs/reference/interference.md does not render {missing}"


def test_site_builds_with_every_public_name(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes and the API pages hold every public name of the three packages."""
    mkdocs = VENV_BIN / "mkdocs"
    if not mkdocs.exists() or importlib.util.find_spec("mkdocstrings") is None:
        pytest.skip("mkdocs is not installed (pip install -e '.[docs]')")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    try:
        proc = subprocess.run([str(mkdocs), "build", "--strict", "-q", "-d", str(tmp_path / "site")], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.skip(f"the site build took over {BUILD_TIMEOUT} s (.ci/run builds it)")
    assert proc.returncode == 0, proc.stderr[-4000:]
    for package in ("interference", "probes", "reports"):
        html = (tmp_path / "site" / "reference" / package / "index.html").read_text()
        ids = set(re.findall(r'id="([\w.]+)"', html))
        names = importlib.import_module(package).__all__
        missing = [n for n in names if f"{package}.{n}" not in ids
                   and not any(i.startswith(f"{package}.") and i.endswith(f".{n}") for i in ids)]
        assert not missing, f"reference/{package}: {missing} not in the built page"
    html = (tmp_path / "site" / "reference" / "agents" / "index.html").read_text()
    for ident in ("agents.train.main", "agents.grid.main", "agents.population.run.run_population", "agents.rl.algos.RLAlgo",
                  "agents.algorithm.Algorithm"):
        assert f'id="{ident}"' in html, f"reference/agents: {ident} not in the built page"


# ----------------------------------------------------------------------------------------------- (d) no history
def test_no_development_history() -> None:
    """No page tells development history (sessions, issue numbers, what was tried and dropped)."""
    hits = [f"{p}:{n}: {line.strip()}" for p in pages()
            for n, line in enumerate((ROOT / p).read_text().splitlines(), 1) if HISTORY.search(line)]
    assert not hits, "development history in the docs:\n" + "\n".join(hits)


def test_block_parser() -> None:
    """The conventions above, on a small page."""
    cmds = _commands('X=1 timeout -s INT 6 python -m agents.train dqn --steps 10 \\\n  --out runs || echo "a # b"  # c\n')
    assert cmds == [["X=1", "timeout", "-s", "INT", "6", "python", "-m", "agents.train", "dqn", "--steps", "10",
                     "--out", "runs"], ["echo", "a # b"]]
    assert _python_module(cmds[0]) == ("agents.train", ["dqn", "--steps", "10", "--out", "runs"])
    assert _python_module([".venv/bin/python", "-m", "pytest", "-q"]) == ("pytest", ["-q"])
    assert _python_module(["pip", "install", "-e", "."]) is None
    assert check_command("reports", ["runs", "-o", "out", "--window", "3"]) == []
    assert check_command("reports", ["runs", "--no-such-flag"]) == [
        "--no-such-flag is not in the --help of python -m reports"]
    assert check_command("no_such_module", []) == ["no module 'no_such_module'"]


if __name__ == "__main__":  # the child processes of python_results and help_texts
    if sys.argv[1:] == ["--help-texts"]:
        print(json.dumps(_serve_help(json.loads(sys.stdin.read()))))
    else:
        print(json.dumps(_run_pages(sys.argv[1:])))

"""Every code block of README.md, BENCHMARKS.md and docs/ runs (issue 45), so no example can rot.

Each page's blocks run in order, as one test each (``test_block[README.md:57 python]``),
in a sandbox directory holding small data under the names the snippets use
(``sandbox`` below makes it) and against a real daemon of the page's own. A
block is what its fence's language says (docs/writing-docs.md tells writers):

- ``python``: executed as ``__main__`` in a fresh namespace, the sandbox the
  working directory; a traceback names the page and its line.
- ``sh``: each command run in the sandbox (``riffle X`` with this checkout's
  daemon binary, ``go run ./cmd/riffle X`` as ``riffle X``, ``python``,
  ``torchrun``); commands that build or install (``pip``, ``make``, ``go``
  build/test/generate, ``.ci/run``) are checked, not run: their flags against
  their ``--help``, their targets and paths against the repository.
- ``go``: a whole program, built in a temporary module that replaces riffle by
  this checkout, then run in the sandbox.
- ``yaml``, ``json``: parsed. ``text``: output, layouts, diagrams: not run.

An HTML comment on the line before a block changes what is done with it:
``<!-- docs-test: skip REASON -->`` (reported as skipped, with the reason),
``<!-- docs-test: continue -->`` (python: the page's previous block's
namespace), ``<!-- docs-test: file NAME -->`` (written to NAME in the sandbox,
for a later sh block to run) and ``<!-- docs-test: flags -->`` (sh: every
command's flags checked against its ``--help``, nothing run).

A code block without a language, an indented one, or a language not above
fails its page's test_page_blocks_are_fenced: nothing is skipped silently.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, Daemon, S3Server, record, riffle_bin, tfrecord_frames

LANGS = {"python", "sh", "go", "yaml", "json", "text"}
MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(skip|continue|file|flags)\b\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
BLOCK_SECONDS = 180


def pages() -> list[Path]:
    """README.md, BENCHMARKS.md and every page under docs/."""
    return [REPO / "README.md", REPO / "BENCHMARKS.md", *sorted((REPO / "docs").rglob("*.md"))]


@dataclass
class Block:
    page: str  # the page, relative to the repository
    line: int  # the block's first line of code, 1-based
    lang: str
    code: str
    mark: str = ""  # skip, continue, file, flags
    arg: str = ""  # the mark's argument: a reason, a file name
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def extract(path: Path) -> list[Block]:
    """The fenced code blocks of a page, each with its language, its first line and the mark before it."""
    rel = str(path.relative_to(REPO))
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3)
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARK.match(prev)
        body, j = [], i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        b = Block(rel, i + 2, lang, "\n".join(body) + "\n", mark.group(1) if mark else "", mark.group(2) if mark else "")
        if j == len(lines):
            b.problems.append(f"{rel}:{i + 1}: the fence {fence} is never closed")
        if lang not in LANGS:
            b.problems.append(f"{rel}:{i + 1}: a code block fenced as {lang or '(no language)'!r}: "
                              f"say what it is ({', '.join(sorted(LANGS))})")
        blocks.append(b)
        i = j + 1
    return blocks


ALL = [b for p in pages() for b in extract(p)]


def _id(b: Block) -> str:
    return f"{b.where} {b.lang}"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_page_blocks_are_fenced(page):
    """Every code block as rendered is a fenced block with a language the runner knows: none is skipped silently."""
    import markdown
    blocks = extract(page)
    problems = [p for b in blocks for p in b.problems]
    for b in blocks:
        if b.mark == "file" and not b.arg:
            problems.append(f"{b.where}: docs-test: file needs a file name")
        if b.mark == "skip" and not b.arg:
            problems.append(f"{b.where}: docs-test: skip needs a reason")
        if b.mark == "continue" and b.lang != "python" or b.mark == "flags" and b.lang != "sh":
            problems.append(f"{b.where}: docs-test: {b.mark} is for {'python' if b.mark == 'continue' else 'sh'} blocks")
    html = markdown.markdown(page.read_text(encoding="utf-8"),
                             extensions=["tables", "admonition", "pymdownx.superfences"])
    rendered = html.count("<pre")
    if rendered != len(blocks):
        problems.append(f"{page.relative_to(REPO)}: {rendered} code blocks as rendered, {len(blocks)} fenced: "
                        "fence every code block (``` with a language), none indented")
    assert not problems, "\n".join(problems)


# --- the sandbox: small data under the names the snippets use ---

def _jpeg(path: Path, seed: int, size: int = 40) -> None:
    from PIL import Image
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path, quality=90)


def _image_folder(root: Path, classes: list[str], per_class: int, seed: int) -> None:
    for c, name in enumerate(classes):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            _jpeg(root / name / f"{name}_{i:03d}.jpg", seed + c * 1000 + i)


def _hf_images(path: Path) -> None:
    import datasets
    import io
    from PIL import Image
    names = ["apple_pie", "baklava", "churros"]
    rng = np.random.default_rng(7)

    def png(i):
        b = io.BytesIO()
        Image.fromarray(rng.integers(0, 255, (48, 40, 3), dtype=np.uint8)).save(b, format="JPEG")
        return {"bytes": b.getvalue(), "path": None}
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names)})
    ds = datasets.Dataset.from_dict({"image": [png(i) for i in range(90)], "label": [i % 3 for i in range(90)]},
                                    features=feats)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(path))


def _jsonl(path: Path, source: str, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"source": source, "i": i, "text": f"{source} document {i}"}) + "\n")


def _token_corpora(d: Path) -> None:
    """docs/tokens.md's corpora: two Megatron prefixes corpus/part-{0,1}, a flat uint16 tokens.bin and a 1-D
    tokens.npy whose documents end at token 0, and tokenized.arrow's input_ids column (uncompressed Arrow), the
    same column as zstd Parquet in tokenized.parquet."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq
    from test_tokens import make_docs, write_megatron
    (d / "corpus").mkdir()
    for k in range(2):
        write_megatron(str(d / "corpus" / f"part-{k}"), make_docs(300, seed=k))
    stream = np.concatenate([np.append(x % 1000 + 1, 0) for x in make_docs(200, seed=5)]).astype("<u2")
    stream.tofile(d / "tokens.bin")
    np.save(d / "tokens.npy", stream)
    rows = pa.array([x.tolist() for x in make_docs(200, seed=6)], pa.list_(pa.int32()))
    feather.write_feather(pa.table({"input_ids": rows}), str(d / "tokenized.arrow"), compression="uncompressed")
    pq.write_table(pa.table({"input_ids": rows}), str(d / "tokenized.parquet"), compression="zstd", data_page_size=4096)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> Path:
    """A directory holding each dataset a snippet names, small."""
    d = tmp_path_factory.mktemp("docs")
    _image_folder(d / "imagenet" / "train", ["cat", "dog", "fox"], 30, 1)
    _image_folder(d / "imagenet" / "val", ["cat", "dog", "fox"], 6, 2)
    _hf_images(d / "food101")
    with open(d / "train.bin", "wb") as f:  # 2,000 CIFAR-sized records (3x32x32 bytes)
        for i in range(2000):
            f.write(record(i, 3072))
    with open(d / "train.tfrecord", "wb") as f:
        f.write(tfrecord_frames([record(i, 256) for i in range(1000)]))
    for k in range(3):
        _jsonl(d / "web" / f"part-{k}.jsonl", "web", 400)
    for k in range(2):
        _jsonl(d / "code" / f"part-{k}.jsonl", "code", 300)
    np.save(d / "books.npy", np.arange(500 * 16, dtype=np.int64).reshape(500, 16))
    _token_corpora(d)
    (d / "examples").symlink_to(REPO / "examples")
    return d


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A real S3-compatible server on loopback whose bucket my-bucket holds train/part-{0,1}.tfrecord."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    bucket = server.root / "my-bucket" / "train"
    bucket.mkdir(parents=True)
    for k in range(2):
        (bucket / f"part-{k}.tfrecord").write_bytes(tfrecord_frames([record(k * 500 + i, 512) for i in range(500)]))
    yield server
    server.stop()


class Page:
    """What one page's blocks share: the sandbox, a daemon, the namespace of its last python block."""

    def __init__(self, sandbox: Path, s3: S3Server | None, sock_dir: Path):
        self.sandbox, self.s3 = sandbox, s3
        self.env = dict(os.environ)
        self.env.update(s3.env if s3 else {})
        # The daemon's catalogue and indexes of read-only data in the sandbox, not the user's.
        self.env.update(RIFFLE_BIN=riffle_bin(), PYTHONPATH=str(REPO / "python"),
                        RIFFLE_SOCKET=str(sock_dir / "riffle.sock"), RIFFLE_CACHE_DIR=str(sandbox / ".cache" / "riffle"),
                        XDG_CACHE_HOME=str(sandbox / ".cache"))
        old = dict(os.environ)
        os.environ.update(self.env)
        try:
            self.daemon = Daemon(self.env["RIFFLE_SOCKET"])
        finally:
            os.environ.clear()
            os.environ.update(old)
        self.namespace: dict | None = None

    def close(self) -> None:
        self.daemon.stop()


@pytest.fixture(scope="module")
def page_runs(sandbox, tmp_path_factory, request):
    runs: dict[str, Page] = {}

    def get(page: str, uses_s3: bool) -> Page:
        if page not in runs:
            s3 = request.getfixturevalue("s3") if uses_s3 else None
            runs[page] = Page(sandbox, s3, tmp_path_factory.mktemp("sock"))
        return runs[page]
    yield get
    for p in runs.values():
        p.close()


def _uses_s3(page: str) -> bool:
    return any("s3://" in b.code for b in ALL if b.page == page)


class _Timeout(Exception):
    pass


def _run_python(b: Block, page: Page, monkeypatch) -> None:
    if b.mark == "continue":
        assert page.namespace is not None, f"{b.where}: continues a python block the page does not run before it"
        ns = page.namespace
    else:
        ns = {"__name__": "__main__", "__file__": str(REPO / b.page)}
    # The page's path and the block's lines, so a traceback names them.
    code = compile("\n" * (b.line - 1) + b.code, str(REPO / b.page), "exec")
    for k, v in page.env.items():
        if os.environ.get(k) != v:
            monkeypatch.setenv(k, v)
    monkeypatch.chdir(page.sandbox)

    def alarm(signum, frame):
        raise _Timeout(f"{b.where}: the block ran over {BLOCK_SECONDS} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(BLOCK_SECONDS)
    try:
        exec(code, ns)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    page.namespace = ns


# --- sh ---

def _commands(code: str) -> list[list[str]]:
    """The block's commands, each split as the shell splits it, comments and continuations dropped."""
    out = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words:
            out.append(words)
    return out


def _help(cmd: list[str], env: dict) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    return p.stdout + p.stderr


def _check_flags(where: str, words: list[str], help_text: str, what: str) -> None:
    """Every --flag and -f of words is one the help text lists."""
    for w in words:
        if w == "--" or not w.startswith("-") or re.fullmatch(r"-\d.*", w):
            continue
        flag = w.split("=", 1)[0]
        pat = re.escape(flag) + r"(?![\w-])"
        assert re.search(r"(^|[\s,\[])" + pat, help_text, re.M), f"{where}: {what} has no flag {flag}"


def _riffle_words(words: list[str]) -> list[str] | None:
    """The riffle arguments of a command that runs riffle (riffle X, go run [-v] ./cmd/riffle X), else None."""
    if words[0] == "riffle":
        return words[1:]
    if words[:2] == ["go", "run"]:
        rest = [w for w in words[2:] if w not in ("-v", "-race")]
        if rest and rest[0] in ("./cmd/riffle", "github.com/riffle-ml/riffle/cmd/riffle"):
            return rest[1:]
    return None


def _riffle_subcommand(args: list[str]) -> list[str]:
    """The subcommand words of riffle's arguments (catalogue ls), up to the first flag or operand that is none."""
    sub, known = [], {"bench", "catalogue", "convert", "demo", "index", "inspect", "load", "pack", "quality", "serve",
                      "status", "train", "transform", "ls", "rm", "gc"}
    for a in args:
        if a.startswith("-") or a not in known:
            break
        sub.append(a)
    return sub


def _check_riffle(where: str, args: list[str], env: dict) -> None:
    sub = _riffle_subcommand(args)
    assert sub or not args or args[0].startswith("-"), f"{where}: riffle has no command {args[0]!r}"
    _check_flags(where, args, _help([riffle_bin(), *sub, "--help"], env), "riffle " + " ".join(sub))


def _check_pip(where: str, words: list[str], env: dict) -> None:
    sub = words[1]
    assert sub in ("install", "wheel", "download", "uninstall"), f"{where}: pip {sub}: not a pip command these docs use"
    _check_flags(where, words[2:], _help([sys.executable, "-m", "pip", sub, "--help"], env), f"pip {sub}")
    for w in words[2:]:
        if w.startswith(("./", "../")) or w.startswith("python"):
            assert (REPO / w).exists(), f"{where}: pip {sub} {w}: no such path in the repository"


def _check_make(where: str, words: list[str]) -> None:
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), re.M))
    for t in words[1:]:
        if "=" not in t and not t.startswith("-"):
            assert t in targets, f"{where}: make {t}: the Makefile has no such target"


def _check_go(where: str, words: list[str]) -> None:
    assert words[1] in ("build", "test", "run", "generate", "vet", "install"), f"{where}: go {words[1]}: not checked"
    for w in words[2:]:
        if w.startswith("./"):
            path = w[2:].rstrip("/").removesuffix("/...").removesuffix("...")
            assert (REPO / path).exists(), f"{where}: go {words[1]} {w}: no such package in the repository"


def _check_path(where: str, words: list[str]) -> None:
    cmd = words[0]
    if "/" in cmd:
        assert (REPO / cmd).exists(), f"{where}: {cmd}: no such file in the repository"
    else:
        assert shutil.which(cmd), f"{where}: {cmd}: no such command"


def _run(where: str, cmd: list[str], page: Page, env: dict) -> None:
    p = subprocess.run(cmd, cwd=page.sandbox, env=env, capture_output=True, text=True, timeout=BLOCK_SECONDS)
    assert p.returncode == 0, f"{where}: {shlex.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"


# torchrun, as its console script runs it. Debian's torch 1.13 under Python
# 3.11 parses its default --redirects/--tee "0" to None (3.11's IntFlag
# iteration skips the zero member Std.NONE) and fails before starting a
# rank; read None as Std.NONE, as torch does on the Pythons it was made for.
TORCHRUN = """
import sys
from torch.distributed.elastic.multiprocessing import api
_from_str = api.Std.from_str.__func__
api.Std.from_str = classmethod(lambda cls, vm: _from_str(cls, vm) or api.Std.NONE)
from torch.distributed.run import main
sys.argv[0] = "torchrun"
main()
"""


def _run_sh(b: Block, page: Page) -> None:
    env = dict(page.env)
    for words in _commands(b.code):
        where = f"{b.where} `{shlex.join(words)}`"
        while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
            k, _, v = words.pop(0).partition("=")
            env[k] = os.path.expandvars(v)
        if words[0] == "sudo":
            words = words[1:]
        if words[0] == "export":
            for kv in words[1:]:
                k, _, v = kv.partition("=")
                env[k] = os.path.expandvars(v)
            continue
        args = _riffle_words(words)
        if args is not None:
            if b.mark == "flags":
                _check_riffle(where, args, env)
            else:
                _run(where, [riffle_bin(), *args], page, env)
        elif words[0] == "pip" or words[:3] == ["python", "-m", "pip"]:
            _check_pip(where, words if words[0] == "pip" else words[2:], env)
        elif words[0] == "make":
            _check_make(where, words)
        elif words[0] == "go":
            _check_go(where, words)
        elif words[0] in ("python", "python3") and b.mark != "flags":
            _run(where, [sys.executable, *words[1:]], page, env)
        elif words[0] == "torchrun" and b.mark != "flags":
            _run(where, [sys.executable, "-c", TORCHRUN, *words[1:]], page, env)
        else:
            _check_path(where, words)


# --- go ---

@pytest.fixture(scope="module")
def go_programs(tmp_path_factory) -> dict[str, str | Exception]:
    """Every go block built, in one temporary module that replaces riffle by this checkout: block -> binary or error."""
    blocks = [b for b in ALL if b.lang == "go" and b.mark != "skip"]
    if not blocks:
        return {}
    d = tmp_path_factory.mktemp("gomod")
    gomod = (REPO / "go.mod").read_text()
    gomod = gomod.replace("module github.com/riffle-ml/riffle", "module riffledocs", 1)
    gomod += f"\nrequire github.com/riffle-ml/riffle v0.0.0\n\nreplace github.com/riffle-ml/riffle => {REPO}\n"
    (d / "go.mod").write_text(gomod)
    shutil.copy(REPO / "go.sum", d / "go.sum")
    names = {}
    for k, b in enumerate(blocks):
        name = f"b{k:03d}"
        (d / name).mkdir()
        # A line directive: the compiler names the page and its line.
        (d / name / "main.go").write_text(f"//line {REPO / b.page}:{b.line}\n" + b.code)
        names[b.where] = name
    go = shutil.which("go") or "/usr/local/go/bin/go"
    tags = subprocess.run([str(REPO / "scripts" / "go-tags")], capture_output=True, text=True).stdout.strip()
    env = dict(os.environ, GOFLAGS="-mod=mod", GOPROXY="off")
    out: dict[str, str | Exception] = {}
    p = subprocess.run([go, "build", "-tags", tags, "-o", str(d / "bin") + "/", "./..."], cwd=d, env=env,
                       capture_output=True, text=True, timeout=600)
    for where, name in names.items():
        exe = d / "bin" / name
        if exe.exists():
            out[where] = str(exe)
        else:
            out[where] = AssertionError(f"{where}: the go block does not build:\n{p.stdout}{p.stderr}")
    return out


def _run_go(b: Block, page: Page, programs: dict) -> None:
    exe = programs[b.where]
    if isinstance(exe, Exception):
        raise exe
    _run(b.where, [exe], page, page.env)


@pytest.mark.parametrize("b", ALL, ids=_id)
def test_block(b: Block, page_runs, monkeypatch, request):
    if b.problems:
        pytest.fail("\n".join(b.problems))
    if b.mark == "skip":
        pytest.skip(f"{b.where}: {b.arg}")
    if b.lang == "text":
        return
    if b.lang == "json":
        try:
            json.loads(b.code)
        except ValueError as e:
            pytest.fail(f"{b.where}: not JSON: {e}")
        return
    if b.lang == "yaml":
        import yaml
        try:
            yaml.safe_load(b.code)
        except yaml.YAMLError as e:
            pytest.fail(f"{b.where}: not YAML: {e}")
        return
    page = page_runs(b.page, _uses_s3(b.page))
    if b.mark == "file":
        path = page.sandbox / b.arg
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(b.code)
        if b.lang == "python":
            compile(b.code, str(REPO / b.page), "exec")
        return
    if b.lang == "python":
        _run_python(b, page, monkeypatch)
    elif b.lang == "sh":
        _run_sh(b, page)
    elif b.lang == "go":
        _run_go(b, page, request.getfixturevalue("go_programs"))


def test_site_build_fails_on_a_broken_link(tmp_path):
    """make docs, as make test runs it, fails on a link to no page: the site of a copy of the docs with one."""
    for name in ("mkdocs.yml", "Makefile", "README.md", "BENCHMARKS.md"):
        shutil.copy(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copytree(REPO / "python" / "riffle", tmp_path / "python" / "riffle")
    with open(tmp_path / "docs" / "cli.md", "a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    p = subprocess.run(["make", "-s", "docs", f"PYTHON={sys.executable}"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode != 0 and "no-such-page.md" in p.stdout + p.stderr, p.stdout + p.stderr

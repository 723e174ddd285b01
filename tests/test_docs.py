"""The README and docs/ point at things that exist: every relative link (and its #anchor), every
repository path, every file name and every `hacrl.<module>` they name. A module moved, a page
renamed or a heading reworded fails here instead of leaving a dangling reference."""

from __future__ import annotations

import importlib
import re
import subprocess
import unicodedata
from functools import cache
from pathlib import Path

import pytest

from hacrl.schema import tags as tag_names

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "sweeps" / "README.md", *(ROOT / "docs").glob("*.md")])
# top-level folders whose paths the pages may name (outputs/, ~/.cache/... are the user's)
TOP = ("hacrl", "experiments", "sweeps", "analysis", "tests", "scripts", "docs", "hydra_plugins",
       ".ci")

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_TOP = "|".join(re.escape(t) for t in TOP)
PATH = re.compile(rf"(?<![\w./~$-])((?:{_TOP})/[\w./*<>-]*)")
FILE_NAME = re.compile(r"(?<![\w./~$<-])([\w-]+\.(?:md|py|yaml|sh|toml))\b")
DOTTED = re.compile(r"(?<![\w.])(hacrl(?:\.[A-Za-z_]\w*)+)")
# files a page tells the reader to create (the worked example of docs/ADDING_A_METHOD.md)
TO_CREATE = {"experiments/method/hacpo_agent_std.yaml"}
# file names that belong to another program: verl's config, Python's startup hook, the job
# run's artifact MLflow stores
NOT_OURS = {"_generated_ppo_trainer.yaml", "sitecustomize.py", "config.yaml"}
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)
CODE_BLOCK = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)


def _text(page: Path) -> str:
    return page.read_text(encoding="utf-8")


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


@cache
def _tracked() -> frozenset[str]:
    """Every file in the repository (git's view: what a clone has), and the folders above them."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = set(out)
    for name in out:
        parts = name.split("/")
        found.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(found)


def _exists(rel: str) -> bool:
    """`rel` (repository-relative; `<placeholder>` and `*` match any one name) names a file or
    folder of the repository. The links `experiments/` and `sweeps/` lead into `hacrl/conf/`."""
    rel = rel.rstrip("/.")
    for link, target in (("experiments", "hacrl/conf"), ("sweeps", "hacrl/conf/sweep")):
        if rel == link or rel.startswith(link + "/"):
            rel = target + rel[len(link):]
    pattern = re.escape(rel).replace(r"\*", "[^/]*")
    pattern = re.sub(r"<[^/>]*>", "[^/]+", pattern.replace(r"\<", "<").replace(r"\>", ">"))
    matcher = re.compile(pattern + r"\Z")
    return any(matcher.match(name) for name in _tracked())


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives `page`'s headings (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in CODE_BLOCK.sub("", _text(page)).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not ours to check offline
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading with the anchor #{anchor} in {dest.name}")
    assert not broken, f"{_rel(page)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_repository_path_exists(page: Path) -> None:
    missing = sorted({p for p in PATH.findall(_text(page)) if p not in TO_CREATE and not _exists(p)})
    assert not missing, f"{_rel(page)} names paths the repository lacks: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_file_name_exists(page: Path) -> None:
    """A bare file name (`train.py`, `CLUSTER.md`) names a file somewhere in the repository."""
    names = {Path(n).name for n in _tracked()}
    text = re.sub(r"https?://\S+", "", _text(page))
    created = {Path(p).name for p in TO_CREATE}
    missing = sorted({n for n in FILE_NAME.findall(text) if n not in names | created | NOT_OURS})
    assert not missing, f"{_rel(page)} names files the repository lacks: {missing}"


def _tag_like(name: str) -> bool:
    known = {v for v in vars(tag_names).values() if isinstance(v, str) and v.startswith("hacrl.")}
    return name in known or name.startswith("hacrl.eval.")


def _resolves(dotted: str) -> bool:
    # a mutant's name, `<module>.x_<function>__mutmut_<n>` (docs/MUTATION.md): its function
    dotted = re.sub(r"\.x_(\w+)__mutmut_\d+$", r".\1", dotted)
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                try:  # a submodule not imported by its package
                    obj = importlib.import_module(f"{obj.__name__}.{attr}")
                    continue
                except (ModuleNotFoundError, AttributeError):
                    return False
            obj = getattr(obj, attr)
        return True
    return False


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_hacrl_name_resolves(page: Path) -> None:
    """`hacrl.x.y` is a module or an attribute of one, or an MLflow tag of `hacrl.schema.tags`."""
    names = {n.rstrip(".") for n in DOTTED.findall(_text(page))}
    bad = sorted(n for n in names if not _tag_like(n) and not _resolves(n))
    assert not bad, f"{_rel(page)} names modules or objects hacrl lacks: {bad}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_page_cites_the_issue_tracker(page: Path) -> None:
    """Readers have the repository, not the tracker: say what changed, or name a commit."""
    found = ISSUE.findall(_text(page))
    assert not found, f"{_rel(page)} cites issues: {found}"


def test_the_checks_catch_what_they_guard(tmp_path: Path) -> None:
    """Planted: a dangling link, a heading's anchor, a moved module, a missing path and file."""
    assert not _exists("hacrl/task")
    assert not any(_exists(p) for p in TO_CREATE)  # once it exists, it needs no exemption
    assert _exists("sweeps/table1.yaml") and _exists("experiments/launcher/")
    assert _exists("tests/test_verl_*.py") and _exists("hacrl/conf/sweep/<name>.yaml")
    assert not _resolves("hacrl.mlflow_stor") and _resolves("hacrl.verify")
    assert _tag_like("hacrl.kind") and not _tag_like("hacrl.kinds")
    assert slug("verl engine (`engine=verl`, `hacrl/engines/verl/`)") == \
        "verl-engine-engineverl-hacrlenginesverl"
    page = tmp_path / "p.md"
    page.write_text("# A b\n\n## A b\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"a-b", "a-b-1"}
    assert FILE_NAME.findall("see PAPER.md and `tests/test_x.py`") == ["PAPER.md"]
    assert ISSUE.findall("before issue 14's tests") == ["issue 14"]

"""`hacrl data`: hub download -> checked local jsonl, exercised on local datasets built here.

The hub is not reachable in tests: each hub source is pointed (by Hydra override) at a local
dataset directory of parquet files in the real schema, which `datasets.load_dataset` reads
through the same code path as a hub id.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import pandas as pd
import pytest

from hacrl.cli.data_commands import add_parsers, main, run
from hacrl.config import ConfigError, compose
from hacrl.data import DataError, DataMissing, load_rows, local_file, local_state, prepare
from hacrl.data.arith import load_split
from hacrl.data.convert import answer_text, last_boxed
from hacrl.data.sources import HubUnreachable, load_sources

INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."

# A few rows of each benchmark, in the schema the hub serves.
MATH500 = {
    "problem": ["What is $1+1$?", "Simplify $\\frac{2}{4}$.", "Find $x$ if $2x=6$."],
    "solution": ["$1+1=\\boxed{2}$", "It is $\\boxed{\\frac{1}{2}}$.", "$x=\\boxed{3}$"],
    "answer": ["2", "\\frac{1}{2}", "3"],
    "subject": ["Prealgebra", "Algebra", "Algebra"],
    "level": [1, 2, 3],
    "unique_id": ["test/prealgebra/1.json", "test/algebra/2.json", "test/algebra/3.json"],
}
MATH_LIGHTEVAL = {
    "problem": ["Compute $\\sqrt{16}$.", "What is $\\frac{1}{2}+\\frac{1}{4}$?"],
    "level": ["Level 1", "Level ?"],
    "solution": ["We get $\\boxed{4}$.", "First $\\boxed{1}$, so $\\boxed{\\frac{3}{4}}$."],
    "type": ["Algebra", "Prealgebra"],
}
GSM8K = {
    "question": ["Natalia sold 48 clips and then 24 more. How many?", "2 apples and 3 more?"],
    "answer": ["48+24=<<48+24=72>>72\n#### 72", "2+3=5\n#### 5"],
}
AMC23 = {
    "id": [0, 1],
    "question": ["How many primes are below 100?", "What is 3^3?"],
    "answer": [25.0, 27.0],
    "url": ["https://example.org/0", "https://example.org/1"],
}
OLYMPIAD = {
    "id": [1606, 1607],
    "question": ["Find the real root of $x^3=8$.", "Find $f(x)$ with $f'=2x$, $f(0)=0$."],
    "solution": [["Cube root."], ["Integrate."]],
    "final_answer": [["$2$"], ["$x^2$"]],
    "is_multiple_answer": [False, False],
    "unit": [None, None],
    "answer_type": ["Numerical", "Expression"],
}


def _hub_dir(root: Path, name: str, split: str, columns: dict) -> Path:
    """A local dataset directory laid out like a hub repo: data/<split>-00000-of-00001.parquet."""
    directory = root / name
    (directory / "data").mkdir(parents=True)
    pd.DataFrame(columns).to_parquet(directory / "data" / f"{split}-00000-of-00001.parquet")
    return directory


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hub")
    return {
        "math500": _hub_dir(root, "fake_math500", "test", MATH500),
        "math": _hub_dir(root, "fake_math_lighteval", "test", MATH_LIGHTEVAL),
        "gsm8k": _hub_dir(root, "fake_gsm8k", "test", GSM8K),
        "amc23": _hub_dir(root, "fake_amc23", "test", AMC23),
        "olympiad": _hub_dir(root, "fake_olympiad", "train", OLYMPIAD),
    }


@pytest.fixture(autouse=True)
def _datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep `datasets`' arrow cache of the local test datasets out of the user's cache."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))


def _overrides(root: Path, hub: dict[str, Path]) -> list[str]:
    rows = {"math500": 3, "math": 2, "gsm8k": 2, "amc23": 2, "olympiad": 2}
    out = [f"data.root={root}"]
    for name, path in hub.items():
        out += [f"data.sources.{name}.hub_id={path}", f"data.sources.{name}.config=null",
                f"data.sources.{name}.rows={rows[name]}"]
    return out


def _cfg(root: Path, hub: dict[str, Path], *extra: str):
    return compose([*_overrides(root, hub), *extra]).data


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_catalog_lists_every_source_with_a_revision() -> None:
    sources = load_sources(compose([]).data)
    hub = {"math_train", "math500", "math", "gsm8k", "aime2025", "amc23", "minerva", "olympiad"}
    tiny = {"tiny_train", "tiny_math500", "tiny_math", "tiny_gsm8k", "tiny_aime2025",
            "tiny_amc23", "tiny_minerva", "tiny_olympiad"}
    assert set(sources) == hub | tiny
    expected_rows = {"math_train": 7500, "math500": 500, "math": 5000, "gsm8k": 1319,
                     "aime2025": 30, "amc23": 40, "minerva": 272, "olympiad": 675}
    for name in hub:
        s = sources[name]
        assert s.is_hub and s.instruction and s.revision and s.rows == expected_rows[name]
    for name in tiny:
        assert not sources[name].is_hub and not sources[name].instruction
        assert sources[name].sha256 is not None


def test_catalog_errors_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"data\.sources\.math500\.colour: unknown key"):
        load_sources(compose(["+data.sources.math500.colour=red"]).data)
    with pytest.raises(ConfigError, match=r"data\.sources\.gsm8k\.hub_id: missing"):
        load_sources(compose(["data.sources.gsm8k.hub_id=null"]).data)
    with pytest.raises(ConfigError, match=r"data\.sources\.amc23\.answer_rule=guess"):
        load_sources(compose(["data.sources.amc23.answer_rule=guess"]).data)


def test_answer_rules() -> None:
    assert last_boxed("so $\\boxed{\\frac{1}{2}}$ and \\boxed{3}") == "3"
    assert last_boxed("no box here") is None
    assert answer_text("x is \\boxed{\\frac{a}{b}}.", "last_boxed") == "\\frac{a}{b}"
    assert answer_text("work\n#### 1,000", "after_hashes") == "1,000"
    assert answer_text(["$x^2$", "$y$"], "first_item") == "x^2"
    assert answer_text(27.0, "field") == "27"
    assert answer_text(0.5, "field") == "0.5"
    assert answer_text([], "first_item") is None


def test_prepare_converts_checks_and_writes(tmp_path: Path, hub: dict[str, Path]) -> None:
    root = tmp_path / "data"
    cfg = _cfg(root, hub)
    results = prepare(cfg, list(hub))
    assert [r.status for r in results] == ["written"] * 5

    math500 = _read(root / "math500.jsonl")
    assert [r["answer"] for r in math500] == ["2", "\\frac{1}{2}", "3"]
    assert math500[0]["uid"] == "math500-test/prealgebra/1.json"
    assert math500[0]["prompt"] == f"What is $1+1$? {INSTRUCTION}"
    assert math500[1]["subject"] == "Algebra" and math500[1]["level"] == 2
    assert set(math500[0]) == {"uid", "problem", "prompt", "answer", "source", "level", "subject"}

    math = _read(root / "math.jsonl")
    assert [r["answer"] for r in math] == ["4", "\\frac{3}{4}"]  # the last \boxed{}
    assert [r["level"] for r in math] == [1, None] and math[0]["type"] == "Algebra"
    assert [r["answer"] for r in _read(root / "gsm8k.jsonl")] == ["72", "5"]
    amc = _read(root / "amc23.jsonl")
    assert [r["answer"] for r in amc] == ["25", "27"] and amc[1]["uid"] == "amc23-1"
    olympiad = _read(root / "olympiad.jsonl")
    assert [r["answer"] for r in olympiad] == ["2", "x^2"]
    assert olympiad[0]["answer_type"] == "Numerical" and olympiad[0]["unit"] is None

    for result in results:
        meta = json.loads((root / f"{result.name}.meta.json").read_text())
        digest = hashlib.sha256(result.path.read_bytes()).hexdigest()
        assert meta["sha256"] == digest == result.sha256
        assert meta["rows"] == result.rows and meta["revision"] == "local"
        assert meta["hub_id"] == str(hub[result.name]) and meta["instruction"] is True
        assert meta["prepared_at"]
    assert not list(root.glob(".*.tmp"))  # temp files renamed or removed

    # A valid copy is skipped; --force rewrites it (same content, new meta).
    assert [r.status for r in prepare(cfg, ["math500", "gsm8k"])] == ["skipped", "skipped"]
    again = prepare(cfg, ["math500"], force=True)
    assert again[0].status == "written" and again[0].sha256 == results[0].sha256
    assert load_rows(cfg, "math500") == math500


def test_row_count_mismatch_writes_nothing(tmp_path: Path, hub: dict[str, Path]) -> None:
    cfg = _cfg(tmp_path / "data", hub, "data.sources.math500.rows=4")
    with pytest.raises(DataError, match=r"data\.sources\.math500\.rows=4: .* gave 3 rows"):
        prepare(cfg, ["math500"])
    assert not (tmp_path / "data" / "math500.jsonl").exists()
    assert not (tmp_path / "data" / "math500.meta.json").exists()


def test_sha256_pin_mismatch_writes_nothing(tmp_path: Path, hub: dict[str, Path]) -> None:
    cfg = _cfg(tmp_path / "data", hub, f"data.sources.gsm8k.sha256={'0' * 64}")
    with pytest.raises(DataError, match=r"data\.sources\.gsm8k\.sha256=000000000000"):
        prepare(cfg, ["gsm8k"])
    assert not list((tmp_path / "data").glob("gsm8k*"))

    # The right pin passes.
    digest = prepare(_cfg(tmp_path / "other", hub), ["gsm8k"])[0].sha256
    pinned = _cfg(tmp_path / "data", hub, f"data.sources.gsm8k.sha256={digest}")
    assert prepare(pinned, ["gsm8k"])[0].status == "written"


def test_missing_hub_source_names_file_and_command(tmp_path: Path) -> None:
    cfg = compose([f"data.root={tmp_path}"]).data
    with pytest.raises(DataMissing) as info:
        local_file(cfg, "math500")
    message = str(info.value)
    assert str(tmp_path / "math500.jsonl") in message
    assert "hacrl data prepare math500" in message and "data.root=" in message
    assert "\n" not in message and isinstance(info.value, ConfigError)


def test_tampered_file_is_refused(tmp_path: Path, hub: dict[str, Path]) -> None:
    cfg = _cfg(tmp_path, hub)
    path = prepare(cfg, ["amc23"])[0].path
    assert local_file(cfg, "amc23") == path
    path.write_text(path.read_text().replace('"27"', '"28"'))
    with pytest.raises(DataError, match=r"amc23\.jsonl is corrupt: .*--force"):
        local_file(cfg, "amc23")
    # an intact copy of another version than the pinned one is stale, not corrupt
    prepare(cfg, ["amc23"], force=True)
    assert local_state(cfg, "amc23").status == "ok"
    pinned = _cfg(tmp_path, hub, f"data.sources.amc23.sha256={'0' * 64}")
    assert local_state(pinned, "amc23").status == "stale"
    # A changed catalog entry makes the copy stale rather than silently reused.
    prepare(cfg, ["amc23"], force=True)
    changed = _cfg(tmp_path, hub, "data.sources.amc23.keep=[url]")
    with pytest.raises(DataError, match="stale"):
        local_file(changed, "amc23")
    assert prepare(changed, ["amc23"])[0].status == "written"
    assert load_rows(changed, "amc23")[0]["url"] == "https://example.org/0"


def test_synthetic_sources_are_prepared_on_demand(tmp_path: Path) -> None:
    cfg = compose([f"data.root={tmp_path}"]).data
    for name, split in (("tiny_amc23", "tiny_amc23"), ("tiny_train", "train")):
        rows = load_rows(cfg, name)
        problems = load_split(split)
        assert [(r["uid"], r["problem"], r["answer"], r["level"]) for r in rows] == [
            (p.uid, p.question, p.answer, p.level) for p in problems]
        assert all(r["prompt"] == r["problem"] for r in rows)  # tiny models: no instruction
        meta = json.loads((tmp_path / f"{name}.meta.json").read_text())
        assert meta["sha256"] == load_sources(cfg)[name].sha256  # the catalog pin
    # A damaged synthetic copy is simply drawn again.
    (tmp_path / "tiny_amc23.jsonl").write_text("{}\n")
    assert len(load_rows(cfg, "tiny_amc23")) == 1000


def test_hub_unreachable_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'HuggingFaceH4/MATH-500' on the Hub "
                              "(LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    cfg = compose([f"data.root={tmp_path}"]).data
    with pytest.raises(HubUnreachable) as info:
        prepare(cfg, ["math500"])
    message = str(info.value)
    assert "data.sources.math500" in message and "HuggingFaceH4/MATH-500" in message
    assert "HF_ENDPOINT" in message and "\n" not in message

    # The cli reports it, does not retry the other hub sources, and still draws tiny ones.
    code = main(["data", "prepare", "math500", "gsm8k", "tiny_aime2025", f"data.root={tmp_path}"])
    out, err = capsys.readouterr()
    assert code == 1 and "Traceback" not in err
    assert err.count("hub is unreachable") == 1
    assert "tiny_aime2025  200" in out and "written" in out


def test_cli_prepare_and_list(tmp_path: Path, hub: dict[str, Path],
                              capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="hacrl")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    root = tmp_path / "data"
    argv = ["data", "prepare", "math500", "olympiad", *_overrides(root, hub)]
    args, unknown = parser.parse_known_args(argv)
    assert run(args, unknown) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["name", "rows", "sha256", "status", "path"]
    digest = hashlib.sha256((root / "math500.jsonl").read_bytes()).hexdigest()
    assert lines[1].split() == ["math500", "3", digest[:12], "written", str(root / "math500.jsonl")]
    assert lines[2].split()[:4] == ["olympiad", "2", lines[2].split()[2], "written"]

    assert main([*argv, "--force"]) == 0 and "written" in capsys.readouterr().out
    assert main(argv) == 0 and "skipped" in capsys.readouterr().out

    assert main(["data", "list", *_overrides(root, hub)]) == 0
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " ok " in listing["math500"] and "hacrl data prepare gsm8k" in listing["gsm8k"]
    assert "prepared on use" in listing["tiny_train"]
    # Against the catalog's own hub ids the copy made from the local directory is stale.
    assert main(["data", "list", "--scale", "paper", f"data.root={root}"]) == 0
    listing = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert " stale " in listing["math500"] and "tiny_train" not in listing

    assert main(["data", "prepare", "nope", f"data.root={root}"]) == 2
    assert "nope: not in data.sources" in capsys.readouterr().err

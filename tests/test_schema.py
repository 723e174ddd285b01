"""Tag names, metric names, output paths and evaluation artifact names have one home each:
`hacrl.schema` and `hacrl.core.layout`.

The check reads every module's string constants (docstrings aside): a tag name spelt out, an
MLflow filter on tags, a metric name (a string starting with one of
`hacrl.schema.metric_names.PREFIXES`), a file name of the output root, or an evaluation
artifact's file name (`hacrl.schema.eval_artifacts`) anywhere else fails it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hacrl.core.layout import Layout
from hacrl.schema import eval_artifacts as A
from hacrl.schema import metric_names as M
from hacrl.schema import tags as T

ROOT = Path(__file__).resolve().parents[1]
# the checkpoint module is the home of what lies inside a checkpoint step folder
HOMES = {"hacrl/schema/tags.py", "hacrl/schema/metric_names.py", "hacrl/schema/eval_artifacts.py",
         "hacrl/core/layout.py", "hacrl/checkpoint/team.py"}
TAG_NAMES = {v for k, v in vars(T).items() if k.isupper() and isinstance(v, str)
             and (v.startswith(("hacrl.", "mlflow.")) or v == T.CONFIG_HASH)}
PATH_NAMES = {"mlflow.db", "mlartifacts", "runs", "sweeps", "reports", "plots", "DONE.json",
              "manifest.json", "status.json", "config.yaml", "ckpt"}
# file names inside an evaluation's artifacts (the report reads them back by these names)
ARTIFACT_NAMES = (A.OUTCOMES_FILE, A.PROTOCOL_FILE, A.SCORES_FILE, A.SAMPLES_SUFFIX)
# the metric families the schema declares (a family added there is covered here); a constant or
# any constant part of an f-string counts. verl's own metrics (`verl/actor/...`) are verl's
# names, not a family of ours, and are not in PREFIXES. Help text such as "e.g. reward/mean"
# does not start with a family, so it passes.
METRIC_PREFIXES = M.PREFIXES


def _strings(node: ast.AST) -> list[str]:
    """The literal text of a constant or of an f-string's constant parts."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)]
    return []


def _literals(path: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(every string constant but docstrings, the strings joined onto a path: `x / "name"`,
    `.glob("pattern")`)."""
    tree = ast.parse(path.read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr)
                  and isinstance(n.body[0].value, ast.Constant)}
    # `__all__` lists a module's names (a function may share a tag's name), not tags
    exported = {id(c) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets)
                for c in ast.walk(n.value)}
    texts = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str)
             and id(n) not in docstrings | exported]
    joined = []
    for n in ast.walk(tree):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            joined += [(n.lineno, t) for t in _strings(n.right)]
        elif (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and n.func.attr in ("glob", "rglob") and n.args):
            joined += [(n.lineno, t) for t in _strings(n.args[0])]
    return texts, joined


def spelt_out() -> list[str]:
    found = []
    for package in ("hacrl", "analysis", "hydra_plugins"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in HOMES:
                continue
            texts, joined = _literals(path)
            found += [f"{rel}:{line}: tag {text!r}" for line, text in texts
                      if text in TAG_NAMES or "tags.`" in text or "tags.config_hash" in text]
            found += [f"{rel}:{line}: metric {text!r}" for line, text in texts
                      if text.startswith(METRIC_PREFIXES)]
            found += [f"{rel}:{line}: path {text!r}" for line, text in joined
                      if text.strip("/") in PATH_NAMES or text.startswith(("team-", "step_"))]
            found += [f"{rel}:{line}: artifact {text!r}" for line, text in texts
                      if text.endswith(ARTIFACT_NAMES)]
    return found


def test_tag_names_and_output_paths_live_in_one_place() -> None:
    found = spelt_out()
    assert not found, f"{len(found)} literals outside hacrl.schema / hacrl.core.layout:\n" + "\n".join(found)


def test_every_metric_constant_is_in_a_declared_family() -> None:
    """The names the schema module spells start with one of its PREFIXES (grad_norm aside: a
    name of its own), so that the check above covers every family it builds."""
    names = {k: v for k, v in vars(M).items() if k.isupper() and isinstance(v, str)
             and "/" in v}
    assert names and all(v.startswith(M.PREFIXES) for v in names.values()), names
    assert set(M.REPORTED_PREFIXES) <= set(M.PREFIXES)
    assert all(p.endswith("/") for p in M.PREFIXES)


def test_metric_names_the_report_and_ui_read() -> None:
    """The names stores already hold: a rename here shows (the report reads these, the MLflow
    UI's saved views pick the `avg/<model>` columns)."""
    assert (M.REWARD_MEAN, M.CAPABILITY, M.RESPONSE_LENGTH_MEAN) == (
        "reward/mean", "capability/P", "response/length_mean")
    assert M.omega("qwen") == "omega/qwen"
    assert [M.ratio(r, "mean") for r in M.RATIOS] == ["ratio/s_homo_mean", "ratio/s_hete_mean"]
    assert M.ratio(M.S_HETE, "min") == "ratio/s_hete_min"
    assert (M.WALL, M.STEP, M.phase_seconds("verify")) == (
        "time/wall_s", "time/step_s", "time/verify_s")
    assert (M.PEAK_RSS, M.DEVICE_USED_FRAC) == ("memory/peak_rss_gb", "memory/device_used_frac")
    assert M.validation("tiny_math500") == "val/tiny_math500/acc"
    assert M.eval_metric("main", "math500") == "eval/main/math500/acc"
    assert M.eval_avg("ablation") == "eval/ablation/avg/acc"
    assert (M.TOKENS_OWN, M.TOKENS_BORROWED, M.UPDATES) == (
        "tokens/own", "tokens/borrowed", "train/updates")
    assert (M.LOSS_TOTAL, M.CLIP_LOWER_BOUND, M.GRAD_NORM) == (
        "loss/total", "clip/lower_bound", "grad_norm")
    assert M.job_score(M.AVG, "qwen") == "avg/qwen" and M.JOB_AVG == "avg/"
    assert M.job_score("math500", "qwen") == "acc/math500/qwen"
    assert M.job_score(M.AVG, "qwen", "ablation") == "ablation/avg/qwen"


def test_eval_artifact_names() -> None:
    assert A.outcomes("main") == "eval/main/outcomes.parquet"
    assert A.folder("ablation") == "eval/ablation"
    assert A.samples_file("tiny_math500") == "tiny_math500.jsonl.gz"
    assert [name for name, _ in A.OUTCOME_COLUMNS] == ["benchmark", "problem", "sample", "answer",
                                                       "correct"]


def test_layout_resolves_the_root_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    layout = Layout.at("~/link")
    assert layout.root == (tmp_path / "real").resolve()
    run = layout.run("abc", "hacrl")
    assert run.path == layout.root / "runs" / "abc-hacrl"
    assert run.lock == layout.root / "runs" / ".abc-hacrl.lock"
    for i in (0, 10, 2):
        run.team(i).path.mkdir(parents=True)
    (run.path / "team-x").mkdir()
    assert [t.path.name for t in run.teams()] == ["team-0", "team-2", "team-10"]
    assert layout.sweep("table1").cell_state("c1") == layout.root / "sweeps/table1/cells/c1.json"


def test_filters_quote_tag_names_and_refuse_quotes() -> None:
    assert T.where({T.KIND: T.JOB, T.CONFIG_HASH: "h"}, "FINISHED") == (
        "tags.`hacrl.kind` = 'job' and tags.`config_hash` = 'h' and attributes.status = 'FINISHED'")
    with pytest.raises(ValueError, match="quote"):
        T.where({T.MODEL: "it's"})
    with pytest.raises(ValueError, match="eval tag field"):
        T.eval_tag("main", "nonsense")

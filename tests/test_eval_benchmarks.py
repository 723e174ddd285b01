"""The seven real-benchmark lm-eval tasks on local fixtures in the hub's schema, offline.

Each benchmark gets three problems in the schema its hub dataset serves; `hacrl data prepare`
converts them (pointed at local dataset folders), the shipped hacrl_* tasks are materialised and
run by lm-eval, and a scripted model answers: the gold answer as written, an equivalent answer in
another form, a wrong answer. So every benchmark must score acc 2/3 (math-verify accepts the
equivalent form) and exact match 1/3 (normalised string match does not); AIME2025 is sampled
twice per problem: (2/2, 1/2, 0/2) -> avg@2 = 1/2, pass@2 = 2/3.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from lm_eval.api.model import LM

from hacrl.config import compose
from hacrl.config.protocol import Protocol
from hacrl.data import load_rows, prepare
from hacrl.evaluation.lmeval import Backend, run_lm_eval

# name -> (split, raw columns in the hub schema, scripted responses per row in order)
FIXTURES: dict[str, tuple[str, dict[str, list[Any]], list[list[str]]]] = {
    "math500": ("test", {
        "problem": ["Compute $\\dbinom{8}{4}$.", "What is $\\frac{9}{2}$ as a decimal?",
                    "Find the smallest prime greater than 7."],
        "solution": ["$\\boxed{70}$", "$\\boxed{4.5}$", "$\\boxed{11}$"],
        "answer": ["70", "\\frac{9}{2}", "11"],
        "subject": ["Counting & Probability", "Prealgebra", "Number Theory"],
        "level": [2, 1, 1],
        "unique_id": ["test/counting/1.json", "test/prealgebra/2.json", "test/nt/3.json"]},
        [["So the count is \\boxed{70}."], ["As a decimal, \\boxed{4.5}."], ["\\boxed{13}"]]),
    "math": ("test", {
        "problem": ["What is $\\sqrt{49}$?", "Simplify $\\frac{2}{8}$.", "Solve $x+1=3$."],
        "level": ["Level 1", "Level 2", "Level 1"],
        "solution": ["$\\sqrt{49}=\\boxed{7}$.", "It is $\\boxed{\\dfrac{1}{4}}$.",
                     "$x = \\boxed{2}$"],
        "type": ["Prealgebra", "Prealgebra", "Algebra"]},
        [["The root is \\boxed{7}."], ["\\boxed{0.25}"], ["\\boxed{-2}"]]),
    "gsm8k": ("test", {
        "question": ["Natalia sold 48 clips in April and 24 in May. How many in total?",
                     "A box holds 12 eggs. How many eggs are in 6 boxes?",
                     "Tom has 5 apples and eats 2. How many are left?"],
        "answer": ["48+24=<<48+24=72>>72\n#### 72", "12*6=<<12*6=72>>72\n#### 72",
                   "5-2=<<5-2=3>>3\n#### 3"]},
        [["She sold \\boxed{72} clips."], ["\\boxed{\\frac{144}{2}}"], ["\\boxed{7}"]]),
    "aime2025": ("test", {
        "problem": ["Find the sum of all integer bases $b>9$ for which $17_b$ divides $97_b$.",
                    "Find the number of ordered pairs described in the problem.",
                    "Find the remainder described in the problem."],
        "answer": ["70", "588", "16"],
        "id": ["0", "1", "2"]},
        [["\\boxed{70}", "\\boxed{70}"], ["\\boxed{588}", "\\boxed{587}"],
         ["\\boxed{15}", "\\boxed{17}"]]),
    "amc23": ("test", {
        "id": [0, 1, 2],
        "question": ["What is $3^3$?", "What is $3 \\cdot 9$?", "How many primes are below 20?"],
        "answer": [27.0, 27.0, 8.0],
        "url": ["https://example.org/0", "https://example.org/1", "https://example.org/2"]},
        [["\\boxed{27}"], ["\\boxed{3^3}"], ["\\boxed{9}"]]),
    "minerva": ("test", {
        "question": ["What fraction of the sample remains?", "Compute the ratio.",
                     "Give the speed in m/s."],
        "answer": ["\\frac{2}{3}", "\\frac{2}{3}", "30"]},
        [["\\boxed{\\frac{2}{3}}"], ["\\boxed{\\frac{4}{6}}"], ["\\boxed{45}"]]),
    "olympiad": ("train", {
        "id": [1606, 1607, 1608],
        "question": ["Find the real root of $x^3=8$.", "Compute $\\cos(\\pi/3)$.",
                     "Find the least positive integer $n$ with $n^2>50$."],
        "solution": [["Cube root."], ["Known value."], ["Check 7 and 8."]],
        "final_answer": [["$2$"], ["$\\frac{1}{2}$"], ["$8$"]],
        "is_multiple_answer": [False, False, False],
        "unit": [None, None, None],
        "answer_type": ["Numerical", "Numerical", "Numerical"]},
        [["\\boxed{2}"], ["\\boxed{\\frac{2}{4}}"], ["\\boxed{7}"]]),
}


class ScriptedLM(LM):
    """An lm-eval model that answers each problem from a script (k-th call -> k-th response)."""

    def __init__(self, script: dict[str, list[str]]) -> None:
        super().__init__()
        self.script = script
        self.calls: Counter[str] = Counter()
        self.prompts: list[str] = []

    @property
    def tokenizer_name(self) -> str:
        return "scripted"

    def apply_chat_template(self, chat_history: list[dict[str, str]],
                            add_generation_prompt: bool = True) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in chat_history) + "<assistant>"

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        out = []
        for request in requests:
            uid = request.doc["uid"]
            responses = self.script[uid]
            out.append(responses[self.calls[uid] % len(responses)])
            self.calls[uid] += 1
            self.prompts.append(request.args[0])
        return out

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[Any]:
        raise NotImplementedError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, list[str]]]:
    """The seven sources prepared from local hub-schema folders; the script keyed by uid."""
    root = tmp_path_factory.mktemp("benchmarks")
    overrides = [f"data.root={root / 'data'}"]
    for name, (split, columns, _) in FIXTURES.items():
        folder = root / "hub" / name / "data"
        folder.mkdir(parents=True)
        pd.DataFrame(columns).to_parquet(folder / f"{split}-00000-of-00001.parquet")
        # a local folder has one (default) config where the hub repo names its own
        overrides += [f"data.sources.{name}.hub_id={folder.parent}", f"data.sources.{name}.rows=3",
                      f"data.sources.{name}.config=null"]
    cfg = compose(["scale=paper", *overrides, "eval.protocols.main.sampled.aime2025.samples=2"])
    prepare(cfg.data, list(FIXTURES))
    script = {}
    for name, (_, _, responses) in FIXTURES.items():
        rows = load_rows(cfg.data, name)
        assert len(rows) == 3
        script.update({row["uid"]: r for row, r in zip(rows, responses, strict=True)})
    return cfg, script


def test_seven_benchmarks_score_a_scripted_model_through_lm_eval(prepared: Any, tmp_path: Path
                                                                  ) -> None:
    cfg, script = prepared
    from hacrl.data import local_file

    benchmarks = list(FIXTURES)
    files = {b: local_file(cfg.data, b) for b in benchmarks}
    protocol = Protocol.from_config(cfg.eval.protocols.main)
    lm = ScriptedLM(script)
    outcome = run_lm_eval("scripted", benchmarks, files, protocol, Backend(), tmp_path, lm=lm)

    for bench in benchmarks:
        got = outcome.metrics[bench]
        if bench == "aime2025":
            assert got == pytest.approx({"acc": 0.5, "exact_match": 0.5, "avg_at_2": 0.5,
                                         "pass_at_2": 2 / 3})
        else:
            assert got == pytest.approx({"acc": 2 / 3, "exact_match": 1 / 3}), bench
    expected_avg = (6 * 2 / 3 + 0.5) / 7
    assert outcome.average["acc"] == pytest.approx(expected_avg)
    # every prompt is the chat-formatted problem with the paper's instruction
    assert len(lm.prompts) == 6 * 3 + 3 * 2
    assert all(p.startswith("<user>") and p.endswith(
        "output the final answer within \\boxed{}.<assistant>") for p in lm.prompts)
    # per-sample records carry the responses and their grades
    m500 = outcome.samples["math500"]
    assert [r["responses"] for r in m500] == [s for s in FIXTURES["math500"][2]]
    assert [g["extracted"] for r in m500 for g in r["grades"]] == ["70", "4.5", "13"]

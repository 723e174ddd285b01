"""Every cell of the `paper` sweep keeps its config hash (the key that says a cell is done, in
run folders and MLflow tags): a refactor that changes one would retrain it, or orphan its runs.

The pinned file was written from the tree before the issue-13 redesign. A change here must be
deliberate: a new config key enters every hash, so new keys go where hashing ignores them or
come with a migration note.

Migration (issue 15, the tiny world with power): at tiny scale a step is 16 prompts (mini-batch
8) instead of 32 (16), and Table 1 runs seeds 0, 1 and 42, so every tiny training cell has a
new hash and trains again; the base cells keep theirs but are evaluated again, because the
evaluation key now includes the benchmarks' pinned data (1300 problems where there were 200).
Paper-scale hashes are unchanged (its Table 1 keeps one seed).

Migration (issue 14, the 30-minute paper sweep): tiny trains 20 steps instead of 25 (Figure 3:
50 instead of 62), so the 104 tiny training cells have new hashes and train again; the base
and timing cells (scale.cost_steps, unchanged) keep theirs. Paper scale is unchanged.

Migration (issue 14, old log-probs from the sampler): the local engine's `engine.old_logprobs`
defaults to `sampler`, which enters the identity, so the 125 tiny training cells (timing cells
included) have new hashes and train again; `engine.old_logprobs=recompute` gives back the old
hashes and the runs made with them. The 7 base cells and paper scale (verl) are unchanged.

Migration (issue 42, as_run = the code behind the paper's numbers): profile=as_run floors the
capability at 1e-8 (the authors' main) instead of 0.01, which enters the identity of every cell
that shares rollouts, and GRPO's identity holds verl's dual clip (algo.dual_clip_c, 3). Changed:
tiny 65 cells (HACPO 32, Naive 12, GRPO 17, the four HACPO ablations), paper 44 (HACPO 27,
Naive 6, GRPO 7, the ablations 4); they train again. New: tiny Table 1 runs HACPO and GSPOx2 on
eight seeds (scale.claim_seeds), 34 more cells. Base, GSPO and GSPOx2 cells keep their hashes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hacrl.config import compose
from hacrl.sweep.grid import expand

PINNED = json.loads((Path(__file__).parent / "fixtures" / "paper_cell_hashes.json").read_text())


@pytest.mark.parametrize("scale", ["tiny", "paper"])
@pytest.mark.slow
@pytest.mark.timeout(1200)  # ~4 min on a loaded 2-core machine
def test_every_paper_cell_keeps_its_config_hash(scale: str) -> None:
    extra = [] if scale == "tiny" else ["scale=paper"]
    cells = expand("paper", lambda overrides: compose([*overrides, *extra])).cells
    now = {" ".join(c.overrides): c.id for c in cells}
    assert len(now) == len(PINNED[scale])
    changed = {k: (PINNED[scale].get(k), v) for k, v in now.items() if PINNED[scale].get(k) != v}
    assert not changed, f"{len(changed)} cells changed hash, e.g. {next(iter(changed.items()))}"

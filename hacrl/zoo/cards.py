"""What a built zoo model's card says about the zoo it belongs to, read without torch.

Every model `hacrl zoo build` writes carries a ``zoo_card.json``. Its ``seed`` is the zoo draw:
the same specs built with another seed are other models (another initialisation and data
order), so jobs on them are other cells (`scale.zoo_seed`, `hacrl.config.training_identity`).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CARD_NAME", "zoo_draw"]

CARD_NAME = "zoo_card.json"


def zoo_draw(model_dir: str | Path) -> int | None:
    """The zoo seed the model in ``model_dir`` was built with; None where it is not a zoo
    build (no card, or a card without the ``init_seed`` that zoo builds record: test micro
    models, where ``seed`` is the model's own initialisation)."""
    path = Path(model_dir) / CARD_NAME
    if not path.is_file():
        return None
    try:
        card = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: unreadable zoo card ({err}); rebuild the model: `hacrl zoo "
                         f"build --force {path.parent.name} --root {path.parent.parent}` with "
                         "the --seed the zoo was built with") from None
    if not isinstance(card, dict) or "init_seed" not in card:
        return None
    seed = card.get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None

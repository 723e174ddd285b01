"""Team checkpoints (`team`: save, verify, restore, DONE.json) and the pickle audit that keeps
a planted pickle from ever being loaded (`pickle_audit`)."""

from hacrl.checkpoint.team import (
    agent_weights,
    complete,
    damaged_weights,
    has_record,
    read_done,
    verify,
)

__all__ = ["agent_weights", "complete", "damaged_weights", "has_record", "read_done", "verify"]

"""MLflow: the store (opened, created and locked in `mlflow_store`), the `Tracker` a job logs
through (`tracker`), and the runs-list views `hacrl ui` saves (`ui_views`)."""

from hacrl.tracking.tracker import (
    Tracker,
    flatten,
    git_commit,
    process_alive,
    process_token,
    standard_tags,
)

__all__ = ["Tracker", "flatten", "git_commit", "process_alive", "process_token", "standard_tags"]

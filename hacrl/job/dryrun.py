"""`hacrl train ... --dry-run`: everything a job would set up, checked, without training.

It composes and validates the job like `hacrl train`, then asks the engine's module for its
own view of each agent (`describe(context, model_path)`, optional: a record, and under "files"
{record key: (relative path, text)} to write). The verl engine builds the agent's verl trainer
config and validates it through verl's dataclasses. The result is printed and, with
`--dry-run-dir`, written there (one YAML per agent) once every agent has passed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hacrl.config import JobSpec
from hacrl.engines.base import EngineContext, engine_hook


def contexts(spec: JobSpec) -> list[tuple[EngineContext, str]]:
    """(context, model path) of every agent of every team, as the job would build them."""
    from hacrl.job import engine_context, job_dir

    root = job_dir(spec)
    return [(engine_context(spec, agent, i, len(team), root.team(t).path), agent.path)
            for t, team in enumerate(spec.teams) for i, agent in enumerate(team)]


def dry_run(spec: JobSpec, write_dir: Path | None = None) -> list[dict[str, Any]]:
    """One record per agent: engine, model, and what the engine's `describe` returns."""
    engine = str(spec.cfg.engine.name)
    describe = engine_hook(engine, "describe")
    records: list[dict[str, Any]] = []
    files: dict[str, str] = {}
    for context, path in contexts(spec):
        record: dict[str, Any] = {"team": str(context.run_dir.name if context.run_dir else ""),
                                  "agent": context.agent_name, "model": path, "engine": engine,
                                  "group_size": context.group_size,
                                  "minibatch_prompts": context.minibatch_prompts,
                                  "updates_per_step": context.updates_per_step}
        if describe is not None:
            described = describe(context, path)
            for key, (name, text) in described.pop("files", {}).items():
                files[name] = text
                if write_dir is not None:
                    record[key] = str(write_dir / name)
            record.update(described)
        records.append(record)
    if write_dir is not None:  # written only once every agent passed: nothing half-written
        for name, text in files.items():
            (write_dir / name).parent.mkdir(parents=True, exist_ok=True)
            (write_dir / name).write_text(text)
        (write_dir / "dry_run.json").write_text(json.dumps(records, indent=1, default=str))
    return records

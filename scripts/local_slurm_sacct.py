#!/usr/bin/env python3
"""A `sacct` stand-in for the local SLURM cluster of scripts/local_slurm.sh (no slurmdbd there).

Without accounting storage the real sacct fails ("accounting storage is disabled"), submitit
then sees every job as UNKNOWN and `result()` of a cancelled or killed job waits forever.
`local_slurm.sh up` copies this file to <state folder>/bin/sacct and `local_slurm.sh env` puts
that folder first on PATH. It answers the one call submitit 1.5.4 makes,

    sacct -o JobID,State,NodeList --parsable2 -j ID [-j ID ...]

from `scontrol -o show job` (the jobs slurmctld still holds: MinJobAge=600 keeps finished ones
for 10 minutes). Output as the real sacct: a header line, then one `JobID|State|NodeList` line
per job; array tasks as `5_1`, the still pending part of an array as `5_[2-3]`; no step lines
(`5.batch`, which submitit skips anyway). A job scontrol no longer knows gets no line (submitit
then reports it as UNKNOWN). Also understood: `-j A,B`, `-j 5_1`, `--jobs=`, `-P`, `-p`,
`-n/--noheader`, `-X/--allocations`, `-a/--allusers`; fields JobID, JobIDRaw, State, NodeList,
Partition, ExitCode. Anything else exits 2 with a message rather than answer wrongly.
Standard library only: runs under any python3.
"""
from __future__ import annotations

import re
import subprocess
import sys
from typing import NoReturn

FIELDS = {name.lower(): name for name in ("JobID", "JobIDRaw", "State", "NodeList", "Partition",
                                          "ExitCode")}
# scontrol shows a few transient flags as the state; in the accounting database (what sacct
# reads) the job is running. submitit counts any state it does not know as finished.
RUNNING_ALIASES = {"CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"}
KEY_RE = re.compile(r"(?:^|\s)(JobId|ArrayJobId|ArrayTaskId|HetJobId|HetJobOffset|JobState|"
                    r"Partition|NodeList|ExitCode)=(\S*)")


def fail(message: str, code: int = 2) -> NoReturn:
    print(f"sacct (local SLURM stand-in): {message}", file=sys.stderr)
    sys.exit(code)


def parse_args(argv: list[str]) -> tuple[list[str], list[str], str, str, bool]:
    """Returns (fields, job ids, separator, line end, header)."""
    fields = ["JobID", "Partition", "State", "ExitCode"]
    jobs: list[str] = []
    sep: str | None = None
    end, header = "", True
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name in ("-o", "--format", "-j", "--jobs") and not eq:
            if not args:
                fail(f"{arg} needs a value")
            value = args.pop(0)
        elif arg[:2] in ("-o", "-j") and len(arg) > 2:
            name, value = arg[:2], arg[2:]
        if name in ("-o", "--format"):
            fields = [f for f in value.split(",") if f]
        elif name in ("-j", "--jobs"):
            jobs.extend(j for j in value.split(",") if j)
        elif arg in ("-P", "--parsable2"):
            sep, end = "|", ""
        elif arg in ("-p", "--parsable"):
            sep, end = "|", "|"
        elif arg in ("-n", "--noheader"):
            header = False
        elif arg in ("-X", "--allocations", "-a", "--allusers"):
            pass  # no step lines are printed anyway; all users' jobs are shown anyway
        else:
            fail(f"option {arg!r} is not supported (only submitit's call: "
                 "sacct -o JobID,State,NodeList --parsable2 -j ID)")
    if sep is None:
        fail("only --parsable2/-P or --parsable/-p output is supported")
    unknown = [f for f in fields if f.split("%")[0].lower() not in FIELDS]
    if unknown:
        fail(f"field(s) {','.join(unknown)} not supported; known: {','.join(FIELDS.values())}")
    return [FIELDS[f.split("%")[0].lower()] for f in fields], jobs, sep, end, header


def job_records(text: str) -> list[dict[str, str]]:
    records = []
    for line in text.splitlines():
        if not line.startswith("JobId="):
            continue  # "No jobs in the system"
        record: dict[str, str] = {}
        for key, value in KEY_RE.findall(line):
            record.setdefault(key, value)  # first occurrence: later free text cannot override
        records.append(record)
    return records


def sacct_id(record: dict[str, str]) -> str:
    if record.get("ArrayJobId") and record.get("ArrayTaskId"):
        task = record["ArrayTaskId"]
        return f"{record['ArrayJobId']}_{task if task.isdigit() else f'[{task}]'}"
    if record.get("HetJobId") and record.get("HetJobOffset"):
        return f"{record['HetJobId']}+{record['HetJobOffset']}"
    return record["JobId"]


def wanted(record: dict[str, str], jobs: list[str]) -> bool:
    if not jobs:
        return True
    for job in jobs:
        main, _, task = job.partition("_")
        if task:
            if record.get("ArrayJobId") == main and record.get("ArrayTaskId") == task:
                return True
        elif main in (record.get("JobId"), record.get("ArrayJobId"), record.get("HetJobId")):
            return True
    return False


def value(record: dict[str, str], field: str) -> str:
    if field == "JobID":
        return sacct_id(record)
    if field == "JobIDRaw":
        return record.get("JobId", "")
    if field == "State":
        state = record.get("JobState", "UNKNOWN")
        return "RUNNING" if state in RUNNING_ALIASES else state
    if field == "NodeList":
        nodes = record.get("NodeList", "")
        return "None assigned" if nodes in ("", "(null)") else nodes
    return record.get(field, "")


def main(argv: list[str]) -> int:
    fields, jobs, sep, end, header = parse_args(argv)
    bad = [j for j in jobs if not re.fullmatch(r"\d+(_\d+)?", j)]
    if bad:
        fail(f"job id(s) {','.join(bad)} not understood (expected 5 or 5_1)")
    run = subprocess.run(["scontrol", "-o", "show", "job"], capture_output=True, text=True)
    if run.returncode != 0:
        fail(f"scontrol -o show job failed: {run.stderr.strip() or run.stdout.strip()}", 1)
    lines = [sep.join(fields) + end] if header else []
    for record in job_records(run.stdout):
        if wanted(record, jobs):
            lines.append(sep.join(value(record, f) for f in fields) + end)
    if lines:
        print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

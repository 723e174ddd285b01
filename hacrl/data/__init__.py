"""Data preparation and local access: hub datasets and the synthetic task as checked jsonl.

`hacrl data prepare` downloads (or draws) every source of `experiments/data/catalog.yaml` into
`data.root`; `local_file` / `load_rows` read them back offline.
"""

from hacrl.data.prepare import PrepareResult, prepare
from hacrl.data.read import load_rows, local_file, local_state
from hacrl.data.sources import DataError, DataMissing, HubUnreachable, Source, load_sources

__all__ = [
    "DataError",
    "DataMissing",
    "HubUnreachable",
    "PrepareResult",
    "Source",
    "load_rows",
    "load_sources",
    "local_file",
    "local_state",
    "prepare",
]

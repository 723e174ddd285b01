"""Sweeps: a paper table's grid expanded into cells (`grid`), run once each (`run`, locally warm
in `warm` or on SLURM in `slurm`), with a state file per cell (`state`), a live progress table
(`progress`) and the job a cell runs (`cell_run`)."""

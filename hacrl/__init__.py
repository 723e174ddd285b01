"""HACRL: heterogeneous agent collaborative RL (HACPO) reproduction harness."""

__version__ = "0.1.0"

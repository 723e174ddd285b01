"""The leaves every layer may use: errors and their one-line reports, atomic file writes, the
output root's layout, processes that die with their parent, ETAs, and phase timers.
Each module is imported by its own name; this package imports nothing."""

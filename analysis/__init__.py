"""Regenerates the paper's tables and figures from MLflow (see the analysis issue)."""

"""What hacrl writes that others read: MLflow tag names, run kinds, metric names, the sweep
manifest. Writers (job, sweep, evaluation) and the reader (analysis) import these; nothing
else spells them. Leaf package: standard library and `hacrl.errors` only."""

"""What hacrl writes that others read: MLflow tag names, run kinds, metric names, evaluation
artifact names, the sweep manifest. Writers (job, sweep, evaluation) and the reader (analysis)
import these; nothing else spells them. Leaf package: the standard library and the other leaves
(`hacrl.core.errors`, `hacrl.core.fileio`, `hacrl.core.layout`) only."""

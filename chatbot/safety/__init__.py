"""Crisis safety: the curated list matched in the graph, and the classifier by meaning beside it."""

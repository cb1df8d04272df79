"""Retrieval: the training pairs nearest a message, in the graph, and whether any is close enough."""

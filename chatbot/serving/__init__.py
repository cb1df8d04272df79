"""Serving: the SavedModel export and the queue that batches concurrent requests."""

"""Training: the stages of a run (data, batches, the model, fit, the best epoch, the model directory), sized to
the data, resumable, across machines."""

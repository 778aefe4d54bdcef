"""Job status for the TrainJob: progress and metrics to the Trainer status server, hang detection."""

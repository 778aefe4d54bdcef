"""N pods of a TrainJob emulated on one machine."""

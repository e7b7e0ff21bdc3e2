"""One importer per input format: each takes one parsed item and returns a TrajectoryRecord or raises
ConversionError."""

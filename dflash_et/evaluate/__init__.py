"""What the pipeline measures: validate (correctness) and bench (speed)."""

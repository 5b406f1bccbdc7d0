"""What the Spark estimators share: where their data and checkpoints live."""

"""Text: the project's own corpus and the prompt sets validate, bench and training draw from."""

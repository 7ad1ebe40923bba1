"""Getting checkpoints (fetch), reading them into models (load), z-lab's draft layout, the built-in pair."""

"""The eager models: one definition of each, which runs eagerly, trains and exports."""

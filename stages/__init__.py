"""The DVC stages: each a thin `python -m stages.<name>` command over dflash_et (see dvc.yaml)."""

"""Lowering the models to ExecuTorch programs, and packaging what ships."""

"""Making the executorch wheel's MLX backend importable on any machine.

The wheel ships `executorch.backends.mlx` without its generated serialization files, so importing
it raises "MLX delegate generated files not found". The wheel's own generator and bundled flatc
produce them (only the Python parts are needed to lower; the C++ runtime parts are for building
the Apple runtime). This writes into the installed wheel, once.
"""

import importlib.util
import sys
from pathlib import Path


def ensure_mlx_backend() -> None:
    """Generate the MLX serialization files if missing, then register the mlx:: custom ops."""
    import executorch.exir

    root = Path(executorch.exir.__file__).parents[1]  # executorch is a namespace package: no __file__
    serialization = root / "backends" / "mlx" / "serialization"
    if not (serialization / "mlx_graph_schema.py").exists():
        spec = importlib.util.spec_from_file_location("_dflash_mlx_generate", serialization / "generate.py")
        gen = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = gen  # its dataclasses look their module up
        spec.loader.exec_module(gen)
        schema = gen.parse_fbs(gen.SCHEMA_FBS)
        gen.run_flatc(str(root / "data" / "bin" / "flatc"))
        gen._fixup_flatc_imports()
        for make, path in [(gen.generate_python_schema, gen.GENERATED_SCHEMA_PY),
                           (gen.generate_python_serializers, gen.GENERATED_SERIALIZERS),
                           (gen.generate_inspector, gen.GENERATED_INSPECTOR)]:
            path.write_text(make(schema))
    import executorch.backends.mlx.custom_ops  # noqa: F401

"""The command layer: thin Typer commands over the core modules."""

# Each command module registers its commands on `app.app` when imported, so importing the package (as every
# import of `runinfra_opt.cli.app` does first) gives the complete CLI. Command modules import nothing heavy at
# module level.
from runinfra_opt.cli import bench, draft, engine, load, manifest, optimize, report, workload  # noqa: F401

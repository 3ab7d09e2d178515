"""The command layer: thin Typer commands over the core modules."""

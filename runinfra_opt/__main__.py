"""`python -m runinfra_opt` runs the CLI."""

from runinfra_opt.cli.app import main

main()

"""The CLI's contract: fast --help/--version without heavy imports, documented exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runinfra_opt import __version__
from runinfra_opt.cli.app import app
from runinfra_opt.exitcodes import ExitCode


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_help_and_version_import_no_heavy_modules() -> None:
    code = (
        "import sys\n"
        "from runinfra_opt.cli.app import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        "r = CliRunner().invoke(app, ['--version'])\n"
        "assert r.exit_code == 0, r.output\n"
        "heavy = [m for m in ('torch', 'transformers', 'pandas', 'scipy', 'plotly', 'numpy') if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"--help imported heavy modules: {out.stdout.strip()}"


@pytest.mark.parametrize("group", [[], ["draft"], ["engine"], ["load"], ["manifest"], ["workload"]])
def test_each_group_lists_its_commands_one_summary_a_row(group: list[str]) -> None:
    """A group's list of commands shows each command's first paragraph of help as one text, wrapped by the
    terminal only: wide enough, each is on its command's row (a docstring's own line breaks once made a ragged
    column here)."""
    import inspect

    import typer

    from runinfra_opt.cli.app import CommandGroup

    result = CliRunner().invoke(app, [*group, "--help"], terminal_width=400, env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    rows = [line.strip("│ ").split(None, 1) for line in result.output.splitlines() if line.startswith("│ ")]
    listed = {row[0]: row[1].strip() for row in rows if len(row) == 2}
    command = typer.main.get_command(app)
    for name in group:
        command = command.commands[name]
    assert isinstance(command, CommandGroup)
    assert command.commands
    for name, sub in command.commands.items():
        summary = " ".join(inspect.cleandoc(sub.help or "").split("\n\n")[0].split())
        assert listed[name] == summary, name


def test_python_m_entry_point() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "runinfra_opt", "--version"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0
    assert out.stdout.strip() == f"runinfra-opt {__version__}"


def test_exit_codes_documented_in_readme() -> None:
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    for code in ExitCode:
        assert f"| {int(code)} |" in readme, f"exit code {int(code)} ({code.name}) missing from README"


def test_atomic_writes_keep_the_old_file_on_error_and_use_the_umask(tmp_path: Path) -> None:
    import os

    import pytest

    from runinfra_opt.fsutil import atomic_open, atomic_write_text

    target = tmp_path / "out.txt"
    atomic_write_text(target, "first\n")
    def interrupted_write() -> None:
        with atomic_open(target) as fh:
            fh.write("half")
            raise RuntimeError("interrupted")

    with pytest.raises(RuntimeError):
        interrupted_write()
    assert target.read_text(encoding="utf-8") == "first\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"], "the temp file was not removed"
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_first_gguf_conversion_prints_no_library_bar(tmp_path: Path) -> None:
    """The real CLI converting a GGUF into an empty cache: transformers' own tqdm bar (frames joined by carriage
    returns, a long line in a CI log) stays out of stderr, and the command still succeeds."""
    from runinfra_opt.models import default_gguf_path
    from tests.tiny_models import build_gguf

    gguf = build_gguf(tmp_path / "tiny.gguf", default_gguf_path())
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}  # the empty cache is the fixture's
    args = ["bench", "--method", "baseline", "--target", str(gguf), "--workload", "chat", "--requests", "1"]
    out = subprocess.run(
        [sys.executable, "-m", "runinfra_opt", *args, "--max-tokens", "2", "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "de-quantizing" not in out.stderr
    assert "\r" not in out.stderr

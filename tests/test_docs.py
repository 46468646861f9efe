"""The documentation keeps up with the code: every command and flag in the generated reference,
every benchmark on a page, the README short, and the `hpo` command running what `python -m` runs.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest
import yaml

from tests.cli import ROOT, run_module

PACKAGES = ("common", "trainers", "search_spaces", "analysis", "hpo")


def reference_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts" / "docs_reference.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generator() -> ModuleType:
    return reference_generator()


def command_modules() -> set[str]:
    """Every module of the packages that runs as `python -m` (an `if __name__ == "__main__"`)."""
    found = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__main__.py" and path.parent.name == "hpo":
                continue  # the `hpo COMMAND` dispatcher itself
            if '__name__ == "__main__"' in path.read_text(encoding="utf-8"):
                parts = path.relative_to(ROOT).with_suffix("").parts
                found.add(".".join(p for p in parts if p != "__main__"))
    return found


def test_every_command_line_has_a_reference_page(generator: ModuleType) -> None:
    from hpo.__main__ import COMMANDS

    covered = {module for module, _ in [*COMMANDS.values(), *generator.OTHER_COMMANDS.values()]}
    assert covered == command_modules()


def test_every_flag_is_on_its_commands_page_with_its_help(generator: ModuleType) -> None:
    pages = generator.pages()
    for command in generator.commands():
        page = pages[f"{command.name}.md"]
        for action in command.parser._actions:
            for flag in action.option_strings:
                if flag in ("-h", "--help"):
                    continue
                assert f"`{flag}`" in page, f"{command.module}: {flag} is not in its reference page"
            if action.option_strings and action.help and "--help" not in action.option_strings:
                own = action.help.replace("%%", "%").split(" Default: ")[
                    0
                ]  # its default has a column
                first_words = " ".join(own.split()[:4])
                assert generator._cell(first_words) in page, (
                    f"{command.module}: help of {action.dest}"
                )


def test_a_flag_from_a_config_field_shows_its_bounds(generator: ModuleType) -> None:
    study = generator.pages()["study.md"]
    row = next(line for line in study.splitlines() if line.startswith("| `--window-hours`"))
    assert "> 0" in row and "12.0" in row
    yaml_page = generator.pages()["study-yaml.md"]
    assert "| `budget.search_budget_pct` |" in yaml_page and "<= 1000" in yaml_page
    assert "| `trial_fraction` | float | 0.02 |" in yaml_page


def test_every_benchmark_has_a_page_in_the_site() -> None:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    listed = set(re.findall(r"benchmarks/(\w+)\.md", str(nav)))
    benchmarks = {p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_")}
    assert benchmarks <= listed, f"benchmarks without a page: {sorted(benchmarks - listed)}"
    for name in benchmarks:
        assert (ROOT / "docs" / "benchmarks" / f"{name}.md").is_file(), name


def test_every_page_is_in_the_nav_and_every_nav_entry_exists() -> None:
    nav = str(yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"])
    listed = set(re.findall(r"[\w./-]+\.md", nav))
    docs = ROOT / "docs"
    written = {str(p.relative_to(docs)) for p in docs.rglob("*.md") if p.parent.name != "reference"}
    assert written - listed == set(), "pages outside the nav"
    generated = {name for name in listed if name.startswith("reference/")}
    assert listed - written - generated == set(), "nav entries without a page"


def test_the_readme_is_short_and_links_the_site() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+)", "\n".join(lines)):
        assert (ROOT / link).is_file(), link


# In one process with the reference's imports: runpy warns that the command's module is loaded.
@pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")
def test_the_hpo_command_lists_and_dispatches(capsys: pytest.CaptureFixture[str]) -> None:
    from hpo.__main__ import main

    assert main(["--help"]) == 0
    assert "study" in capsys.readouterr().out
    assert main(["no-such-command"]) == 2
    assert "unknown command 'no-such-command'" in capsys.readouterr().err
    assert main(["tiny", "--help"]) == 0
    assert "--pretrain-steps" in capsys.readouterr().out


def test_hpo_study_is_python_m_hpo_study() -> None:
    # A bad flag value: the command's own one-line error and exit code 2, through `hpo`.
    via_hpo = run_module("hpo", "study", "--n-trials", "0", timeout=120)
    direct = run_module("hpo.study", "--n-trials", "0", timeout=120)
    assert via_hpo.returncode == direct.returncode == 2
    assert via_hpo.stderr == direct.stderr and "n_trials" in direct.stderr


def test_the_entry_point_is_declared() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^hpo = "hpo\.__main__:main"$', text, re.M)
    tree = ast.parse((ROOT / "hpo" / "__main__.py").read_text(encoding="utf-8"))
    assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)


def test_the_module_map_is_in_the_site() -> None:
    assert (ROOT / "docs" / "design" / "layout.md").read_text(encoding="utf-8").count(
        "\n## Modules\n"
    ) == 1
    assert Path(ROOT / "README.md").read_text(encoding="utf-8").count("docs/design/layout.md") >= 1


def test_every_flag_has_a_help_text(generator: ModuleType) -> None:
    # The reference and --help both show it: a flag without one is undocumented.
    missing = [
        f"{command.module}: {action.option_strings[-1]}"
        for command in generator.commands()
        for action in command.parser._actions
        if action.option_strings and not action.help
    ]
    assert not missing, "flags without help: " + ", ".join(missing)

"""What `pip install .` ships: every package of the source tree, so non-editable installs work too."""

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "envace_mcp").rglob("__init__.py")}
    found |= {"envace_mcp.servers"} if (ROOT / "servers" / "__init__.py").exists() else set()
    assert found == listed
    assert config["package-dir"]["envace_mcp.servers"] == "servers"


def test_the_shipped_adapter_is_package_data():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = config["package-data"]["envace_mcp.policy"]
    folder = ROOT / "envace_mcp" / "policy"
    files = [p.relative_to(folder).as_posix() for p in (folder / "adapters").rglob("*") if p.is_file()]
    assert "adapters/smollm2-bank/adapter_model.safetensors" in files
    assert [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)] == []


def test_every_file_the_code_reads_beside_it_is_package_data():
    """Data files inside the package (not Python, not caches) ship: the judge's rubric, the adapter."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    missing = []
    for path in (ROOT / "envace_mcp").rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(ROOT).parts)
        while package and package not in config["package-data"]:
            package = package.rpartition(".")[0]
        base = ROOT.joinpath(*package.split("."))
        patterns = config["package-data"].get(package, [])
        if not any(fnmatch.fnmatch(path.relative_to(base).as_posix(), pattern) for pattern in patterns):
            missing.append(path.relative_to(ROOT).as_posix())
    assert missing == []

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

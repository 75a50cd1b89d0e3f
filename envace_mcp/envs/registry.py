"""Suites by name: the bundled domains and the external benchmarks' adapters, behind one interface."""

from __future__ import annotations

from envace_mcp.envs.suites import Suite, TaskSuite
from envace_mcp.errors import UserError

_SUITES = ("bank", "retail")


def suites() -> list[str]:
    return list(_SUITES)


_EXTERNAL = ("tau2-airline", "tau2-retail", "bfcl-base", "bfcl-miss_func", "bfcl-miss_param",
             "bfcl-long_context", "bfcl-simple", "bfcl-multiple", "bfcl-parallel", "bfcl-parallel_multiple",
             "bfcl-irrelevance")


def get_suite(name: str, seed: int = 0) -> TaskSuite:
    """A bundled suite (`Suite`) or an external benchmark's adapter with the same interface."""
    if name in _EXTERNAL and name.startswith("tau2-"):
        from envace_mcp.envs.tau2 import Tau2Suite

        return Tau2Suite(name.removeprefix("tau2-"))
    if name in _EXTERNAL:
        from envace_mcp.envs.bfcl import BfclSuite
        from envace_mcp.envs.bfcl_ast import AST_CATEGORIES, BfclAstSuite

        category = name.removeprefix("bfcl-")
        return BfclAstSuite(category) if category in AST_CATEGORIES else BfclSuite(category)
    if name not in _SUITES:
        raise UserError(f"unknown suite {name!r}; bundled: {', '.join(_SUITES)}; external: {', '.join(_EXTERNAL)}")
    return Suite(name, seed)


def external_suites() -> list[str]:
    return list(_EXTERNAL)

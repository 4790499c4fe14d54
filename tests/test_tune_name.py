"""``tt.tune`` is the function and ``turbotrain.tune`` the package that holds it: the import forms
docs/architecture.md promises for each keep working."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import turbotrain as tt


def test_tt_tune_is_the_function_of_tune_api():
    from turbotrain.tune.api import tune

    assert inspect.isfunction(tt.tune) and tt.tune is tune


def test_the_package_contents_import_with_from():
    from turbotrain.tune import find_batch_size
    from turbotrain.tune.search import search_plan

    package = importlib.import_module("turbotrain.tune")
    assert inspect.ismodule(package) and package.find_batch_size is find_batch_size
    assert package.search_plan is search_plan


def test_import_as_of_the_package_gives_the_function_as_documented():
    """The trap the docs warn about: ``import turbotrain.tune.api as m`` goes through the attribute.
    When this fails the trap is gone: say so in docs/architecture.md."""
    code = ("import turbotrain.tune as t, inspect; assert inspect.isfunction(t)\n"
            "try:\n    import turbotrain.tune.api as m\nexcept ImportError:\n    print('ImportError')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "ImportError"

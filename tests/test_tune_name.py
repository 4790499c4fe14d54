"""One meaning per name: ``tt.tune`` is the tuner function and its package is ``turbotrain.tuning``.

The package used to be ``turbotrain.tune`` too, and ``turbotrain/__init__.py`` bound the function over
it: ``from turbotrain.tune import x`` reached the package, ``import turbotrain.tune.api as m`` the
function (an ``ImportError``). Each test here fails if a name of the package means two things again.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest

import turbotrain as tt


def test_tt_tune_is_the_function_of_tuning_api():
    from turbotrain import tune
    from turbotrain.tuning.api import tune as defined

    assert inspect.isfunction(tt.tune) and tt.tune is tune is defined


def test_the_package_is_turbotrain_tuning_whichever_way_it_is_imported():
    from turbotrain.tuning import find_batch_size
    from turbotrain.tuning.search import search_plan

    package = importlib.import_module("turbotrain.tuning")
    assert inspect.ismodule(package) and tt.tuning is package
    assert package.find_batch_size is find_batch_size and package.search_plan is search_plan
    assert package.tune is tt.tune


def test_turbotrain_tune_is_no_module():
    """``turbotrain.tune`` names the function only: importing it as a module fails, in a fresh process too
    (where nothing has imported the package yet)."""
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("turbotrain.tune")
    assert "turbotrain.tune" not in sys.modules
    code = ("import inspect, turbotrain.tuning.api as m\n"
            "assert inspect.ismodule(m) and m.__name__ == 'turbotrain.tuning.api'\n"
            "try:\n    import turbotrain.tune\nexcept ModuleNotFoundError:\n    print('no module')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "no module"


# Modules whose parent binds a function of the same name over them: none since ``setup.py`` became ``own_loop.py``
# (``tt.setup`` is its function). The set may only stay empty.
KNOWN_SHADOWED: set[str] = set()


def test_no_new_attribute_of_a_package_shadows_its_own_submodule():
    """The trap in general: ``package.name`` must be the submodule ``package.name`` wherever both exist."""
    shadowed = set()
    for info in pkgutil.walk_packages(tt.__path__, "turbotrain."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        parent, _, leaf = info.name.rpartition(".")
        if getattr(sys.modules[parent], leaf) is not module:
            shadowed.add(info.name)
    assert "turbotrain.tuning" not in shadowed
    assert shadowed - KNOWN_SHADOWED == set(), "a function imported over its own module's name"
    assert KNOWN_SHADOWED - shadowed == set(), "no longer shadowed: take it off KNOWN_SHADOWED"

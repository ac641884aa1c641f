"""Runs SGLang's benchmark client, `python -m sglang.bench_serving`, as shipped in the `sglang`
package from PyPI (pinned in tests/python/requirements-sglang-bench.txt, installed with
`--no-deps`), without SGLang's server stack, which its import chain drags in but the client
never runs. Arguments are bench_serving's own; its code runs unchanged.

What is left out, and why that is safe for the client:
- The package initializers of `sglang`, `sglang.srt` and `sglang.srt.utils` are not run (the
  frontend language API and the server's utilities: torch, triton, PIL, FastAPI, ...). The
  modules bench_serving imports from inside them (`sglang.benchmark.*`,
  `sglang.srt.utils.network`, `sglang.srt.environ`) run as shipped.
- `sglang.srt.disaggregation.utils` (the server's prefill/decode disaggregation, torch): the
  client takes one constant from it, `FAKE_BOOTSTRAP_HOST`, for `--fake-prefill` only; it is
  given here with the value that module has ("2.2.2.2").
- `PIL`, `datasets` and `pybase64` are importable but empty: only the image and MMMU datasets
  use them. Anything taken from them fails loudly if called.

    python3 tests/python/sglang_bench_serving.py --backend sglang --base-url URL ...
"""

import importlib.util
import os
import runpy
import sys
import types


class _Absent:
    """Something from a module this launcher leaves out: any use of it fails, naming it."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} is left out by {os.path.basename(__file__)}")


class _AbsentModule(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self.__name__}.{attr}")


def _package_without_init(name, directory):
    """`name` as a package whose modules import normally but whose `__init__` never runs."""
    module = types.ModuleType(name)
    module.__path__ = [directory]
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def main():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("the sglang package is not installed "
                 "(pip install --no-deps -r tests/python/requirements-sglang-bench.txt)")
    root = list(spec.submodule_search_locations)[0]
    _package_without_init("sglang", root)
    _package_without_init("sglang.srt", os.path.join(root, "srt"))
    _package_without_init("sglang.srt.utils", os.path.join(root, "srt", "utils"))
    _package_without_init("sglang.srt.disaggregation", os.path.join(root, "srt", "disaggregation"))
    disagg_utils = types.ModuleType("sglang.srt.disaggregation.utils")
    disagg_utils.FAKE_BOOTSTRAP_HOST = "2.2.2.2"
    sys.modules[disagg_utils.__name__] = disagg_utils
    for name in ("PIL", "datasets", "pybase64"):
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = _AbsentModule(name)
    sys.argv = ["sglang.bench_serving", *sys.argv[1:]]
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()

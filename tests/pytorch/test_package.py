"""holdfast_torch as an installed package (packaging/python; tests/pytorch/run.sh builds the wheel
and installs it into a fresh environment): what is imported is the installed package, never the
clone; its version is the library's; importing it compiles nothing and takes at most 2 s beyond
importing torch; under another torch it fails at import naming both versions; the source
directory is refused with the install command; the wheel pip wheel made holds the package and
requires the torch release it was built for; a Cache pickles through the package.

    python tests/pytorch/test_package.py [case...]     (a python with holdfast_torch installed)
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_store_support as sup  # noqa: E402

CASES, case = sup.case_list()
check = sup.check
REPO = sup.REPO


def child(code, cwd=None, env=None):
    """`code` in a fresh interpreter of this environment, outside the clone: its result."""
    with tempfile.TemporaryDirectory() as d:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              cwd=cwd or d, env=env, timeout=120)


def library_version():
    with open(os.path.join(REPO, "include", "holdfast", "version.hpp")) as f:
        return re.search(r'#define HOLDFAST_VERSION_STRING "([^"]+)"', f.read()).group(1)


@case
def the_installed_package_is_imported_with_the_library_version():
    r = child("import json, sysconfig, holdfast_torch as h, torch\n"
              "print(json.dumps([h.__file__, h._ext.__file__, h.__version__, h.TORCH_VERSION,"
              " torch.__version__, h._ext.holdfast_version,"
              " sysconfig.get_paths()['purelib']]))")
    check(r.returncode == 0, f"import failed: {r.stderr[-2000:]}")
    init, ext, version, built_for, torch_version, ext_version, site = json.loads(r.stdout)
    for path in (init, ext):
        check(os.path.dirname(path) == os.path.join(site, "holdfast_torch"),
              f"{path} is not in this environment's site-packages {site}")
    check(version == library_version() == ext_version,
          f"__version__ {version}, the extension's {ext_version}, version.hpp's "
          f"{library_version()}")
    check(built_for == torch_version, f"built for torch {built_for}, running {torch_version}")


@case
def importing_takes_at_most_2_s_beyond_torch_and_compiles_nothing():
    # Each sample: a fresh interpreter imports torch, then holdfast_torch, timing the second
    # import alone. A build at import needs torch's extension builder and setuptools (neither
    # may be loaded after it), and a JIT build leaves its lock file and objects in
    # TORCH_EXTENSIONS_DIR (pointed at an empty directory here).
    code = ("import sys, time, torch\n"
            "t = time.perf_counter()\n"
            "import holdfast_torch\n"
            "took = time.perf_counter() - t\n"
            "print(sorted(m for m in ('torch.utils.cpp_extension', 'setuptools', 'distutils')"
            " if m in sys.modules))\n"
            "print(took)")
    with tempfile.TemporaryDirectory() as ext_dir:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=ext_dir)
        samples = []
        for _ in range(3):
            r = child(code, env=env)
            check(r.returncode == 0, f"import failed: {r.stderr[-2000:]}")
            builders, took = r.stdout.splitlines()[-2:]
            check(builders == "[]", f"the import loaded a build tool: {builders}")
            samples.append(float(took))
        check(not os.listdir(ext_dir), f"the import built something: {os.listdir(ext_dir)}")
    took = statistics.median(samples)
    print(f"import holdfast_torch after torch: median {took:.3f} s of {samples}", flush=True)
    check(took <= 2.0, f"importing holdfast_torch took {took:.2f} s beyond torch (at most 2)")


@case
def another_torch_fails_at_import_naming_both_versions():
    # The check reads torch.__version__ before the extension is loaded: a torch reporting
    # another version is what a second installation looks like from here.
    r = child("import torch\n"
              "built = torch.__version__\n"
              "torch.__version__ = '2.99.1+other'\n"
              "try:\n"
              "    import holdfast_torch\n"
              "except ImportError as e:\n"
              "    print(built)\n"
              "    print(e)\n"
              "    import sys\n"
              "    print('holdfast_torch._C' in sys.modules)\n"
              "else:\n"
              "    print('imported')\n")
    check(r.returncode == 0, f"the child failed: {r.stderr[-2000:]}")
    lines = r.stdout.splitlines()
    check(lines[0] != "imported" and len(lines) == 3, f"no ImportError: {r.stdout}")
    built, message, loaded = lines
    check(f"built for torch {built}" in message and "this is torch 2.99.1+other" in message,
          f"the message does not name both versions: {message}")
    check("pip install --no-build-isolation" in message, f"no reinstall command: {message}")
    check(loaded == "False", "the extension was loaded before the version check")


@case
def the_source_directory_is_refused_with_the_install_command():
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "packaging", "python"),
               PYTHONDONTWRITEBYTECODE="1")
    r = child("import holdfast_torch", env=env)
    check(r.returncode != 0, "the source directory imported")
    check("not an installed package" in r.stderr and
          "pip install --no-build-isolation ./packaging/python" in r.stderr,
          f"unclear refusal: {r.stderr[-1500:]}")


@case
def a_copy_of_the_package_directory_alone_names_where_the_headers_should_be():
    import shutil
    with tempfile.TemporaryDirectory() as d:
        copy = os.path.join(d, "packaging", "python")
        shutil.copytree(os.path.join(REPO, "packaging", "python"), copy)
        r = subprocess.run([sys.executable, "setup.py", "--version"], cwd=copy,
                           capture_output=True, text=True, timeout=120)
    check(r.returncode != 0, f"setup.py ran without the headers: {r.stdout}")
    check(f"holdfast's headers are not at {os.path.join(d, 'include')}" in r.stderr,
          f"unclear failure: {r.stderr[-1500:]}")


@case
def the_wheel_holds_the_package_and_requires_its_torch():
    # The wheel tests/pytorch/run.sh made with pip wheel (HOLDFAST_PYTORCH_WHEELS names its
    # directory): the same files as the installed package, the library's version, the torch
    # release it was built against as its one requirement.
    import zipfile
    wheels = os.environ.get("HOLDFAST_PYTORCH_WHEELS") or os.path.join(REPO, "build",
                                                                        "pytorch-wheel")
    found = [f for f in os.listdir(wheels) if f.endswith(".whl")] if os.path.isdir(wheels) else []
    check(len(found) == 1, f"not one wheel in {wheels}: {found}")
    version = library_version()
    check(found[0].startswith(f"holdfast_torch-{version}-"), f"{found[0]}: not version {version}")
    with zipfile.ZipFile(os.path.join(wheels, found[0])) as z:
        names = z.namelist()
        meta = z.read(f"holdfast_torch-{version}.dist-info/METADATA").decode()
        info = z.read("holdfast_torch/_build_info.py").decode()
    check(any(re.fullmatch(r"holdfast_torch/_C\.cpython-.*\.so", n) for n in names) and
          "holdfast_torch/__init__.py" in names, f"the wheel lacks the package: {names}")
    check(not any(n.endswith((".cpp", ".hpp")) for n in names), f"sources in the wheel: {names}")
    # What this environment has installed is that wheel (run.sh installs it in place of the
    # directory's install): pip records the wheel file as where the package came from.
    r = child("from importlib.metadata import distribution\n"
              "print(distribution('holdfast-torch').read_text('direct_url.json'))")
    check(r.returncode == 0 and found[0] in r.stdout,
          f"the installed package did not come from {found[0]}: {r.stdout} {r.stderr[-500:]}")
    import torch
    release = torch.__version__.split("+", 1)[0]
    check(f"Requires-Dist: torch=={release}" in meta, f"no torch=={release} requirement: {meta}")
    check(repr(torch.__version__) in info, f"{info} does not name torch {torch.__version__}")


@case
def a_cache_pickles_through_the_package():
    r = child("import os, pickle, tempfile, holdfast_torch as h\n"
              "d = tempfile.mkdtemp()\n"
              "c = h.Cache(4, dir=d)\n"
              "c.put(1, b'one')\n"
              "data = pickle.dumps(c)\n"
              "print(type(c).__module__)\n"
              "print(pickle.loads(data).get(1))\n"
              "del c\n"
              "import shutil; shutil.rmtree(d)\n")
    check(r.returncode == 0, f"the child failed: {r.stderr[-2000:]}")
    module, got = r.stdout.splitlines()
    check(module == "holdfast_torch._C" and got == "b'one'", f"{module}: {got}")


if __name__ == "__main__":
    sys.exit(sup.run_cases(CASES, sys.argv[1:]))

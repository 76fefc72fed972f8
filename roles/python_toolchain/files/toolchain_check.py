"""Compare a venv with its pins, then import the frameworks (python_toolchain's verify).

Runs inside the venv: argv[1] is the JSON list of pins (name==version),
argv[2] the JSON list of modules to import when their distribution is pinned.
Prints one JSON line last: what was found, each mismatch, each import.
"""

import importlib
import importlib.metadata
import json
import re
import sys

pins = json.loads(sys.argv[1])
modules = json.loads(sys.argv[2])
found, mismatches, imports = {}, [], {}
for pin in pins:
    name, _, expected = pin.partition("==")
    name = re.sub(r"\[.*\]$", "", name).strip()
    try:
        version = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = None
    found[name] = version
    if version != expected:
        mismatches.append({"name": name, "expected": expected, "found": version, "how": "installed"})
    if name in modules:
        # A wheel can install and still not load (another CUDA build, a missing
        # library): the version the module itself reports is the one that counts.
        try:
            loaded = str(getattr(importlib.import_module(name), "__version__", None))
        except Exception as error:  # any import failure is the finding
            loaded = f"import failed: {type(error).__name__}: {error}"
        imports[name] = loaded
        if loaded != expected:
            mismatches.append({"name": name, "expected": expected, "found": loaded, "how": "imported"})
print(json.dumps({"found": found, "imports": imports, "mismatches": mismatches}))

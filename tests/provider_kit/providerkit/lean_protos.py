"""Imported first by each double's entry point: Pulumi's generated gRPC modules then load without the `pulumi`
package's own __init__, which imports the whole SDK (about 0.4 s), and without `pulumi.runtime.proto`'s, which imports
every one of them (the doubles need three). The engine starts provider plugins one after
another, a few for each `pulumi` command, so this is most of a double's start-up. Only a plugin process does
this: where the SDK is already imported (a test process), nothing changes."""

import importlib.util
import sys
import types

if "pulumi" not in sys.modules:
    _spec = importlib.util.find_spec("pulumi")  # finds the package without running it
    if _spec is not None and _spec.submodule_search_locations:
        _root = list(_spec.submodule_search_locations)[0]
        for _name, _path in (("pulumi", _root), ("pulumi.runtime", f"{_root}/runtime"),
                             ("pulumi.runtime.proto", f"{_root}/runtime/proto")):
            _package = types.ModuleType(_name)
            _package.__path__ = [_path]
            sys.modules[_name] = _package

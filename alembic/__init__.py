"""packscope.migrations: the Alembic environment and revisions (this folder installs under that name).

Run from a checkout with `python -m ...`, the checkout root is on sys.path and `import alembic`
finds this folder instead of the Alembic library. Imported under that wrong name, this module
loads the library in its place, so the server and the tests work from a checkout too. (A folder
without __init__.py would avoid this, but setuptools' editable installs cannot map a namespace
package below a regular one.)
"""

if __name__ == "alembic":
    import importlib.util
    import os
    import sys
    from importlib.machinery import PathFinder

    _checkout = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    _path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _checkout]
    _spec = PathFinder.find_spec("alembic", _path)
    if _spec is None or _spec.loader is None:
        raise ImportError("the alembic library is not installed; pip install 'packscope[server]'")
    _library = importlib.util.module_from_spec(_spec)
    sys.modules["alembic"] = _library  # the import statement returns what sys.modules holds
    _spec.loader.exec_module(_library)

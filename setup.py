"""The optional C extension of the one-phase path (see txmanager/postgres/accelerated.py): a
build that fails leaves the pure-Python package, which runs the same (the rest is in pyproject.toml)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("txmanager._onephase", ["txmanager/_onephase.c"], optional=True)])

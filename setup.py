from setuptools import setup; setup(cffi_modules=["fdcore/_build.py:ffibuilder"])

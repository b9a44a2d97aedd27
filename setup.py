"""Maps the repository root to the `sporenet` import root and lists its subpackages."""

from setuptools import find_packages, setup

NOT_SHIPPED = [
    "tests",
    "tests.*",
    "benchmarks",
    "benchmarks.*",
    "examples",
    "examples.*",
    "scripts",
    "scripts.*",
    "build",
    "build.*",
]

setup(
    packages=["sporenet", *(f"sporenet.{n}" for n in find_packages(".", exclude=NOT_SHIPPED))],
    # py.typed: the package ships type hints (PEP 561).
    package_data={"sporenet": ["py.typed"], "sporenet.proto": ["*.fbs", "*.proto"]},
)

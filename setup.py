"""Build of tracekit: the package layout and the optional C scanner (the rest is in pyproject.toml).

The repository keeps ``analyses/`` and ``collectors/`` beside ``tracekit/``; they install as
``tracekit.analyses`` and ``tracekit.collectors`` (``package_dir``), so that nothing generic lands
at the top of site-packages. ``tracekit.ingest._kscan`` speeds up reading Kineto JSON; it is
optional: when it cannot be compiled, the install goes on and the reader uses its msgspec path.
"""

from setuptools import Extension, find_packages, setup

MOVED = {"analyses": "tracekit.analyses", "collectors": "tracekit.collectors"}
"""Repository folder → the package it installs as (its subfolders follow)."""

packages = find_packages(include=["tracekit", "tracekit.*"])
for folder, name in MOVED.items():
    packages += [name] + [name + p[len(folder):] for p in find_packages(include=[folder + ".*"])]

setup(
    packages=packages,
    package_dir={name: folder for folder, name in MOVED.items()},
    package_data={"tracekit.analyses": ["*.sql"]},
    ext_modules=[
        Extension(
            "tracekit.ingest._kscan",
            sources=["tracekit/ingest/_kscan.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
)

"""Build of tracekit: the optional C scanner (everything else is in pyproject.toml).

``tracekit.ingest._kscan`` speeds up reading Kineto JSON; it is optional: when it cannot be
compiled, the install goes on and the reader uses its msgspec path.
"""

from setuptools import Extension, find_packages, setup

setup(
    packages=find_packages(include=["tracekit", "tracekit.*"]),
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

"""Which files the wheel holds (the rest of the build is in pyproject.toml): the packages found
under tuner/ with their data (tuner/data), and the root folder search_spaces/, the one copy of
the built-in search spaces, installed as tuner/search_spaces. tuner/search/space.py reads them
there, or from the checkout's root when the tuner runs from a checkout (an editable install
maps tuner.search_spaces to the root folder too)."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[*find_namespace_packages(include=["tuner*"]), "tuner.search_spaces"],
    package_dir={"tuner.search_spaces": "search_spaces"},
    package_data={"tuner": ["data/**/*", "data/*/*", "data/*/*/*"],
                  "tuner.search_spaces": ["*.yaml"]},
)

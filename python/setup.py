"""The one build step: copy the repository's build/libmoe.so* (if it exists) into the
package as libmoe/_lib/, so an installed package finds the library without LIBMOE_LIBRARY.
Nothing is compiled. Without a build/ the package installs without the library and looks for
it through LIBMOE_LIBRARY or the system loader (docs/python.md)."""
import glob
import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildPyWithLib(build_py):
    def run(self):
        super().run()
        build_dir = os.environ.get("LIBMOE_BUILD_DIR", os.path.join(HERE, "..", "build"))
        libs = glob.glob(os.path.join(build_dir, "libmoe.so*"))
        if libs:
            dst = os.path.join(self.build_lib, "libmoe", "_lib")
            os.makedirs(dst, exist_ok=True)
            for f in libs:
                shutil.copy2(os.path.realpath(f), os.path.join(dst, os.path.basename(f)))


setup(cmdclass={"build_py": BuildPyWithLib})

# Conan 2 recipe for holdfast, a header-only library, in the conventions of conan-center-index.
#
#   conan create packaging/conan --version 0.1.0
#
# The recipe lives in the repository, so it exports the include tree and the license from the
# repository root instead of downloading a release archive.
import os

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.files import copy
from conan.tools.layout import basic_layout

required_conan_version = ">=2.0"


class HoldfastConan(ConanFile):
    name = "holdfast"
    version = "0.1.0"
    description = ("Keeps training jobs safe on preemptible machines: atomic publishing, a "
                   "pfio-compatible file cache, termination configs, step agreement and an "
                   "artifact store")
    license = "MIT"
    topics = ("preemption", "checkpoint", "training", "atomic-write", "etcd", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    no_copy_source = True

    @property
    def _min_cppstd(self):
        return 17

    @property
    def _repo_root(self):
        return os.path.join(self.recipe_folder, "..", "..")

    def export_sources(self):
        copy(self, "include/*", src=self._repo_root, dst=self.export_sources_folder)
        copy(self, "LICENSE", src=self._repo_root, dst=self.export_sources_folder)

    def layout(self):
        basic_layout(self, src_folder=".")

    def package_id(self):
        self.info.clear()

    def validate(self):
        check_min_cppstd(self, self._min_cppstd)
        if self.settings.os not in ("Linux", "FreeBSD", "Macos"):
            raise ConanInvalidConfiguration(f"{self.ref} needs a POSIX system (Linux first)")

    def source(self):
        pass  # the sources are exported with the recipe

    def package(self):
        copy(self, "LICENSE", src=self.source_folder, dst=os.path.join(self.package_folder, "licenses"))
        copy(self, "*.hpp", src=os.path.join(self.source_folder, "include"),
             dst=os.path.join(self.package_folder, "include"))

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "holdfast")
        self.cpp_info.set_property("cmake_target_name", "holdfast::holdfast")
        self.cpp_info.set_property("pkg_config_name", "holdfast")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]

# Overlay port for holdfast (header-only), in the conventions of the vcpkg registry.
#
#   vcpkg install holdfast --overlay-ports=<holdfast>/packaging/vcpkg
#
# The port lives in the repository, so its source is the repository itself. A registry copy
# would instead use vcpkg_from_github(OUT_SOURCE_PATH SOURCE_PATH REPO ... REF "v${VERSION}" ...).
set(VCPKG_BUILD_TYPE release) # header-only: nothing differs between debug and release

get_filename_component(SOURCE_PATH "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)

vcpkg_cmake_configure(
    SOURCE_PATH "${SOURCE_PATH}"
    OPTIONS
        -DHOLDFAST_BUILD_TESTS=OFF
        -DHOLDFAST_BUILD_BENCHMARKS=OFF
        -DHOLDFAST_BUILD_EXAMPLES=OFF
)
vcpkg_cmake_install()
vcpkg_cmake_config_fixup(PACKAGE_NAME holdfast CONFIG_PATH share/cmake/holdfast)
vcpkg_fixup_pkgconfig()

file(REMOVE_RECURSE "${CURRENT_PACKAGES_DIR}/share/doc")
vcpkg_install_copyright(FILE_LIST "${SOURCE_PATH}/LICENSE")
file(INSTALL "${CMAKE_CURRENT_LIST_DIR}/usage" DESTINATION "${CURRENT_PACKAGES_DIR}/share/${PORT}")

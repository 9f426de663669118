# `cmake --install BUILD --prefix P` (included from the top-level CMakeLists.txt) lays out
#   P/bin/zerotrain, P/bin/zerotrain-rank       the CLI and its rank shim
#   P/lib/libzerotrain.a                        the library
#   P/include/zerotrain/...                     the public headers (include/zerotrain/)
#   P/lib/cmake/zerotrain/                      zerotrainConfig.cmake,
#                                               zerotrainConfigVersion.cmake,
#                                               zerotrainTargets*.cmake
# so that a program needs only
#   find_package(zerotrain 0.8 REQUIRED)
#   target_link_libraries(app PRIVATE zerotrain::zerotrain)
# (docs/install.md; tests/install/consumer.sh checks it).
#
# [Package Torch] The torch wheel ships LibTorch without a CMake package this build can
# use, so zt_torch (include dirs, library dir, the _GLIBCXX_USE_CXX11_ABI define, and
# CUDA/NCCL when ZT_WITH_CUDA) is exported with the library as zerotrain::torch: its paths
# are the ones this build found, recorded at configure time. Recorded rather than
# re-queried from a python at the consumer's configure, because a program must compile
# against the very torch the library was built with (ABI, version); the config file checks
# that the recorded paths still exist and says which one is missing and what to do.
include(CMakePackageConfigHelpers)
set(ZT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/zerotrain)

# Public headers use C++20 (defaulted comparisons): a usage requirement.
target_compile_features(zerotrain PUBLIC cxx_std_20)
set_target_properties(zt_torch PROPERTIES EXPORT_NAME torch)
install(TARGETS zerotrain zt_torch EXPORT zerotrainTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
# The installed CLI finds libtorch (and NCCL, CUDA) where it was linked from.
set_target_properties(zerotrain_cli PROPERTIES INSTALL_RPATH_USE_LINK_PATH TRUE)
install(TARGETS zerotrain_cli zerotrain_rank RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${CMAKE_SOURCE_DIR}/include/zerotrain DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
  FILES_MATCHING PATTERN "*.h")
install(EXPORT zerotrainTargets NAMESPACE zerotrain:: DESTINATION ${ZT_INSTALL_CMAKEDIR})

configure_package_config_file(cmake/zerotrainConfig.cmake.in ${CMAKE_BINARY_DIR}/zerotrainConfig.cmake
  INSTALL_DESTINATION ${ZT_INSTALL_CMAKEDIR})
# 0.x: a minor release may break the API, so 0.8 accepts 0.8.* only.
write_basic_package_version_file(${CMAKE_BINARY_DIR}/zerotrainConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_BINARY_DIR}/zerotrainConfig.cmake ${CMAKE_BINARY_DIR}/zerotrainConfigVersion.cmake
  DESTINATION ${ZT_INSTALL_CMAKEDIR})

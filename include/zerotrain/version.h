// The zerotrain release this library was built as: the CMake project version
// (project(zerotrain VERSION ...)), "MAJOR.MINOR.PATCH". Checkpoint manifests record it
// as "zerotrain_version"; find_package(zerotrain <version>) checks the same number.
#pragma once

namespace zt {

// A static string, e.g. "0.8.0"; never null.
const char* version();

}  // namespace zt

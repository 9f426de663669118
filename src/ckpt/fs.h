// Small POSIX file helpers for crash-safe checkpoints. Every failure throws
// zt::CheckpointError naming the path and the OS error.
//
// [Atomic Publish] A file or directory becomes visible under its final name only by
// rename(2) after its contents (and, for a directory, every file in it) were fsync'ed;
// the parent directory is fsync'ed after the rename so the new name survives a power
// loss. A crash at any point leaves either the old name or the complete new one.
#pragma once
#include <string>

namespace zt::ckpt {

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
// mkdir -p.
void make_dirs(const std::string& path);
// fsync of a file or a directory.
void fsync_path(const std::string& path);
// Writes `text` to path.tmp, fsyncs it, renames it onto `path` and fsyncs the parent
// directory. See [Atomic Publish].
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_text_file(const std::string& path);
// Removes a file or a directory tree (nftw; not std::filesystem::remove_all, which is
// unreliable in LibTorch-linked binaries). A missing path is not an error.
void remove_tree(const std::string& path);
// rename(2), throwing on failure.
void rename_path(const std::string& from, const std::string& to);
std::string parent_dir(const std::string& path);
std::string join_path(const std::string& a, const std::string& b);

}  // namespace zt::ckpt

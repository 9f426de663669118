#include "ckpt/fs.h"

#include <fcntl.h>
#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "zerotrain/error.h"

namespace zt::ckpt {

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_dirs(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const std::string parent = parent_dir(path);
  if (!parent.empty() && parent != path) make_dirs(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    throw CheckpointError(detail::cat("cannot create directory '", path, "': ", std::strerror(errno)));
  }
}

void fsync_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZT_CHECK_T(fd >= 0, CheckpointError, "cannot open '", path, "' to fsync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  ZT_CHECK_T(rc == 0, CheckpointError, "fsync of '", path, "' failed: ", std::strerror(e));
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ZT_CHECK_T(fd >= 0, CheckpointError, "cannot create '", tmp, "': ", std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      int e = errno;
      ::close(fd);
      throw CheckpointError(detail::cat("cannot write '", tmp, "': ", std::strerror(e), " (disk full?)"));
    }
    done += static_cast<size_t>(w);
  }
  int rc = ::fsync(fd);
  int e = errno;
  ::close(fd);
  ZT_CHECK_T(rc == 0, CheckpointError, "fsync of '", tmp, "' failed: ", std::strerror(e));
  rename_path(tmp, path);
  fsync_path(parent_dir(path));
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  ZT_CHECK_T(f.good(), CheckpointError, "cannot read '", path, "'");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

namespace {
int remove_entry(const char* p, const struct stat*, int, struct FTW*) { return ::remove(p) == 0 ? 0 : -1; }
}  // namespace

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  if (!S_ISDIR(st.st_mode)) {
    ZT_CHECK_T(::unlink(path.c_str()) == 0, CheckpointError, "cannot remove '", path, "': ", std::strerror(errno));
    return;
  }
  ZT_CHECK_T(::nftw(path.c_str(), remove_entry, 16, FTW_DEPTH | FTW_PHYS) == 0, CheckpointError, "cannot remove '",
             path, "': ", std::strerror(errno));
}

void rename_path(const std::string& from, const std::string& to) {
  ZT_CHECK_T(::rename(from.c_str(), to.c_str()) == 0, CheckpointError, "cannot rename '", from, "' to '", to,
             "': ", std::strerror(errno));
}

std::string parent_dir(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  auto pos = p.rfind('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return p.substr(0, pos);
}

std::string join_path(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  return a.back() == '/' ? a + b : a + "/" + b;
}

}  // namespace zt::ckpt

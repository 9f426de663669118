// DirLock: see [Save Dir Lock] in ckpt/dir_lock.h.
#include "ckpt/dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>

#include "ckpt/fs.h"
#include "zerotrain/error.h"

namespace zt::ckpt {

namespace {

std::string holder_text() {
  char host[256] = {0};
  if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "?");
  char when[32] = {0};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&now, &tm);
  std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S UTC", &tm);
  return detail::cat("host ", host, " pid ", ::getpid(), " since ", when);
}

}  // namespace

struct DirLock::Held {
  int fd = -1;
  std::string path;
  ~Held() {
    if (fd >= 0) ::close(fd);  // releases the flock
  }
};

const std::string& DirLock::path() const { return held_->path; }

std::unique_ptr<DirLock> DirLock::acquire(const std::string& dir) {
  make_dirs(dir);
  const std::string path = join_path(dir, ".zerotrain.lock");
  // This process's locks, by lock file: a directory it already holds is shared.
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<Held>> held_here;
  std::error_code ec;
  std::string key = std::filesystem::weakly_canonical(path, ec).string();
  if (ec) key = path;
  std::lock_guard<std::mutex> lock(mu);
  if (auto h = held_here[key].lock()) return std::unique_ptr<DirLock>(new DirLock(h));
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ZT_CHECK_T(fd >= 0, CheckpointError, "cannot open the lock file ", path, ": ", std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    std::string holder;
    char buf[512];
    const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
    if (n > 0) holder.assign(buf, static_cast<size_t>(n));
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == '\0')) holder.pop_back();
    ::close(fd);
    ZT_CHECK_T(err != EWOULDBLOCK, CheckpointError, "checkpoint directory ", dir,
               " is in use by another zerotrain job (", holder.empty() ? "holder unknown" : holder,
               "): two jobs saving into one directory would mix their checkpoints; wait for it to end, or give "
               "another directory");
    ZT_CHECK_T(false, CheckpointError, "cannot lock the checkpoint directory ", dir, " (flock: ", std::strerror(err),
               "): its file system may not support locks; give a directory on a local file system");
  }
  const std::string text = holder_text() + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    const int err = errno;
    ::close(fd);
    ZT_CHECK_T(false, CheckpointError, "cannot write the lock file ", path, ": ", std::strerror(err));
  }
  auto h = std::make_shared<Held>();
  h->fd = fd;
  h->path = path;
  held_here[key] = h;
  return std::unique_ptr<DirLock>(new DirLock(h));
}

DirLock::~DirLock() = default;

}  // namespace zt::ckpt

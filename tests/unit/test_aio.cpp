// NVMe-offload async I/O (src/offload/aio.h): random data written through a SwapFile and
// read back must match exactly, for both engines, with and without O_DIRECT, with
// requests split by block_size, queue_depth 1, single submit and one-batch-at-a-time; the
// fallbacks (no io_uring, no O_DIRECT) are forced with a thread-local seccomp filter and
// must be logged; misuse and bad nvme_path settings give errors naming the path.
// Files go to a temp directory under ZT_BINARY_DIR, or under $ZT_AIO_TEST_DIR when set
// (to run the suite on another filesystem, e.g. an NVMe mount).
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/magic.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "offload/aio.h"
#include "zerotrain/error.h"

namespace zt_test_aio {

namespace {

using zt::offload::AioOptions;
using zt::offload::AlignedBuffer;
using zt::offload::SwapFile;
using zt::offload::kAioAlignment;

std::string test_base() {
  const char* e = std::getenv("ZT_AIO_TEST_DIR");
  return e && *e ? e : ZT_BINARY_DIR;
}

// A fresh directory, removed with its (flat) contents; no std::filesystem::remove_all.
class TempDir {
 public:
  explicit TempDir(const std::string& base) {
    static int counter = 0;
    path_ = base + "/zt_aio_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    if (::mkdir(path_.c_str(), 0700) != 0) {
      throw std::runtime_error("cannot create test directory " + path_ + ": " + std::strerror(errno));
    }
  }
  ~TempDir() {
    if (DIR* d = ::opendir(path_.c_str())) {
      std::vector<std::string> names;
      while (dirent* e = ::readdir(d)) {
        const std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(d);
      for (const auto& n : names) ::unlink((path_ + "/" + n).c_str());
    }
    ::rmdir(path_.c_str());
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  bool empty() const {
    DIR* d = ::opendir(path_.c_str());
    if (!d) return false;
    int n = 0;
    while (dirent* e = ::readdir(d)) n += std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0;
    ::closedir(d);
    return n == 0;
  }

 private:
  std::string path_;
};

struct LogSink {
  std::vector<std::string> lines;
  zt::offload::AioLog fn() {
    return [this](const std::string& s) { lines.push_back(s); };
  }
  bool mentions(const std::string& what) const {
    for (const auto& l : lines)
      if (l.find(what) != std::string::npos) return true;
    return false;
  }
  std::string all() const {
    std::string s;
    for (const auto& l : lines) s += l + "\n";
    return s;
  }
};

bool file_exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

void fill_random(AlignedBuffer& b, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* w = static_cast<uint64_t*>(b.data());
  for (size_t i = 0; i < b.size() / sizeof(uint64_t); ++i) w[i] = rng();
}

// Runs fn and expects an exception of type E whose message contains every needle.
template <typename E>
void expect_error(const std::function<void()>& fn, std::initializer_list<std::string> needles) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const E& e) {
    const std::string msg = e.what();
    for (const auto& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type: " << e.what();
  }
}

constexpr int64_t kRegion = 5 * 1024 * 1024 + 12 * 1024;  // 5 MiB + 12 KiB: not a multiple of block_size
constexpr int kRegions = 3;

// Write kRegions random regions (all in flight at once), read them back (all in flight),
// then the swap pattern: read one region while another is rewritten. Everything exact.
void round_trip(const std::string& dir, const AioOptions& opt, const std::string& label) {
  SCOPED_TRACE(label);
  LogSink log;
  SwapFile f(dir + "/" + label + ".swp", kRegions * kRegion, opt, log.fn());
  EXPECT_TRUE(file_exists(f.path()));
  EXPECT_EQ(f.size(), kRegions * kRegion);
  if (opt.force_threads) {
    EXPECT_EQ(f.engine(), "threads");
    EXPECT_TRUE(log.mentions("force_threads")) << log.all();
  } else if (f.engine() != "io_uring") {
    EXPECT_EQ(f.engine(), "threads");
    EXPECT_TRUE(log.mentions("io_uring is not usable")) << log.all();  // the fallback is never silent
  }
  if (!opt.use_o_direct) {
    EXPECT_FALSE(f.direct());
  } else if (!f.direct()) {
    EXPECT_TRUE(log.mentions("O_DIRECT is not supported")) << log.all();
  }
  EXPECT_TRUE(log.mentions(f.path())) << log.all();
  std::printf("[ aio      ] %-28s engine=%s direct=%d\n", label.c_str(), f.engine().c_str(), f.direct() ? 1 : 0);

  std::vector<AlignedBuffer> src, dst;
  for (int i = 0; i < kRegions; ++i) {
    src.emplace_back(kRegion);
    dst.emplace_back(kRegion);
    fill_random(src[i], 1000 + i);
    std::memset(dst[i].data(), 0xAB, dst[i].size());
  }
  std::vector<uint64_t> w, r;
  for (int i = 0; i < kRegions; ++i) w.push_back(f.write_async(i * kRegion, src[i].data(), kRegion));
  for (int i = kRegions - 1; i >= 0; --i) f.wait(w[i]);  // out of issue order
  for (int i = 0; i < kRegions; ++i) r.push_back(f.read_async(i * kRegion, dst[i].data(), kRegion));
  f.wait(r[1]);
  f.wait(r[0]);
  f.wait(r[2]);
  for (int i = 0; i < kRegions; ++i) {
    EXPECT_EQ(std::memcmp(src[i].data(), dst[i].data(), kRegion), 0) << "region " << i;
  }

  // Swap pattern: read region 2 (next sub-group) while writing region 0 (previous one).
  fill_random(src[0], 77);
  std::memset(dst[2].data(), 0, dst[2].size());
  const uint64_t tw = f.write_async(0, src[0].data(), kRegion);
  const uint64_t tr = f.read_async(2 * kRegion, dst[2].data(), kRegion);
  f.wait(tr);
  EXPECT_EQ(std::memcmp(src[2].data(), dst[2].data(), kRegion), 0);
  f.wait(tw);
  std::memset(dst[0].data(), 0, dst[0].size());
  f.read_async(0, dst[0].data(), kRegion);
  f.read_async(kRegion, dst[1].data(), kRegion);
  f.wait_all();
  EXPECT_EQ(std::memcmp(src[0].data(), dst[0].data(), kRegion), 0);
  EXPECT_EQ(std::memcmp(src[1].data(), dst[1].data(), kRegion), 0);
  // bytes == 0 is a no-op ticket.
  f.wait(f.read_async(0, dst[0].data(), 0));
}

struct Config {
  std::string label;
  AioOptions opt;
};

std::vector<Config> configs() {
  std::vector<Config> out;
  for (bool direct : {true, false}) {
    const std::string d = direct ? "_direct" : "_buffered";
    AioOptions o;
    o.use_o_direct = direct;
    out.push_back({"uring_default" + d, o});
    AioOptions a = o;
    a.block_size = 64 * 1024;
    a.queue_depth = 1;
    a.single_submit = true;
    out.push_back({"uring_64k_qd1_single" + d, a});
    AioOptions b = o;
    b.block_size = 256 * 1024;
    b.queue_depth = 3;
    b.overlap_events = false;
    out.push_back({"uring_256k_qd3_batches" + d, b});
    AioOptions c = o;
    c.block_size = 128 * 1024;
    c.queue_depth = 32;
    c.single_submit = true;
    c.overlap_events = false;
    out.push_back({"uring_128k_qd32_single_batch" + d, c});
    AioOptions t = o;
    t.force_threads = true;
    out.push_back({"threads_1" + d, t});
    AioOptions t4 = o;
    t4.force_threads = true;
    t4.thread_count = 4;
    t4.block_size = 256 * 1024;
    out.push_back({"threads_4_256k" + d, t4});
  }
  return out;
}

// Runs fn on a fresh thread under a seccomp filter that makes io_uring_setup fail with
// ENOSYS and/or open(O_DIRECT) fail with EINVAL, as on an old kernel, in a locked-down
// container, or on tmpfs/overlayfs. Filters are per-thread without TSYNC, so the rest of
// the test process is unaffected. Returns false when seccomp is unavailable.
bool run_restricted(bool no_uring, bool no_direct, const std::function<void()>& fn) {
  bool installed = false;
  std::exception_ptr error;
  std::thread th([&] {
    const unsigned kDirect = O_DIRECT;
    std::vector<sock_filter> prog = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
    };
    if (no_uring) {
      prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1));
      prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS));
    }
    if (no_direct) {
      // openat(dirfd, path, flags, mode): flags are args[2]; the low word holds O_DIRECT.
      prog.push_back(BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 0, 3));
      prog.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, args[2])));
      prog.push_back(BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, kDirect, 0, 1));
      prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL));
    }
    prog.push_back(BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW));
    sock_fprog fprog{static_cast<unsigned short>(prog.size()), prog.data()};
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return;
    if (::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0) return;
    installed = true;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
  });
  th.join();
  if (error) std::rethrow_exception(error);
  return installed;
}

}  // namespace

TEST(Aio, AlignedBufferRoundsUpAndAligns) {
  AlignedBuffer b(10000);
  EXPECT_EQ(b.size(), 3 * kAioAlignment);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % kAioAlignment, 0u);
  AlignedBuffer moved(std::move(b));
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
  EXPECT_EQ(moved.size(), 3 * kAioAlignment);
  AlignedBuffer none(0);
  EXPECT_EQ(none.data(), nullptr);
}

TEST(Aio, RoundTripAllEnginesAndSettings) {
  TempDir dir(test_base());
  for (const Config& c : configs()) round_trip(dir.path(), c.opt, c.label);
  EXPECT_TRUE(dir.empty()) << "swap files must be removed on destruction";
}

TEST(Aio, RoundTripOnTmpfs) {
  struct statfs sfs {};
  if (::statfs("/dev/shm", &sfs) != 0 || sfs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not a tmpfs";
  TempDir dir("/dev/shm");
  for (const Config& c : configs()) round_trip(dir.path(), c.opt, c.label);
}

TEST(Aio, FallsBackLoudlyWithoutIoUringOrODirect) {
  TempDir dir(test_base());
  LogSink log;
  std::string engine;
  bool direct = true;
  const bool ran = run_restricted(true, true, [&] {
    AioOptions opt;
    opt.block_size = 256 * 1024;
    round_trip(dir.path(), opt, "restricted");
    SwapFile f(dir.path() + "/restricted_log.swp", 1 << 20, opt, log.fn());
    engine = f.engine();
    direct = f.direct();
  });
  if (!ran) GTEST_SKIP() << "seccomp filters are not available here";
  EXPECT_EQ(engine, "threads");
  EXPECT_FALSE(direct);
  EXPECT_TRUE(log.mentions("io_uring is not usable")) << log.all();
  EXPECT_TRUE(log.mentions("io_uring_setup failed")) << log.all();
  EXPECT_TRUE(log.mentions("O_DIRECT is not supported")) << log.all();
  EXPECT_TRUE(log.mentions("buffered (O_DIRECT refused)")) << log.all();
}

TEST(Aio, MisalignedTransfersAreRejected) {
  TempDir dir(test_base());
  LogSink log;
  SwapFile f(dir.path() + "/align.swp", 1 << 20, AioOptions{}, log.fn());
  AlignedBuffer b(1 << 16);
  char* p = static_cast<char*>(b.data());
  expect_error<zt::Error>([&] { f.read_async(0, p + 8, 4096); }, {f.path(), "aligned", "AlignedBuffer"});
  expect_error<zt::Error>([&] { f.write_async(100, p, 4096); }, {f.path(), "offset 100"});
  expect_error<zt::Error>([&] { f.write_async(0, p, 5000); }, {f.path(), "byte count 5000", "pad"});
  expect_error<zt::Error>([&] { f.read_async(1 << 20, p, 4096); }, {f.path(), "past the end"});
  expect_error<zt::Error>([&] { f.wait(12345); }, {"unknown ticket 12345", f.path()});
  const uint64_t t = f.write_async(0, p, 4096);
  f.wait(t);
  expect_error<zt::Error>([&] { f.wait(t); }, {"unknown ticket"});  // a ticket is waited once
}

TEST(Aio, BadOptionsAndSizesAreConfigErrors) {
  TempDir dir(test_base());
  LogSink log;
  AioOptions o;
  o.block_size = 1000;
  expect_error<zt::ConfigError>([&] { SwapFile(dir.path() + "/a.swp", 1 << 20, o, log.fn()); },
                                {"aio.block_size 1000"});
  o = AioOptions{};
  o.queue_depth = 0;
  expect_error<zt::ConfigError>([&] { SwapFile(dir.path() + "/a.swp", 1 << 20, o, log.fn()); }, {"aio.queue_depth"});
  o = AioOptions{};
  o.thread_count = 0;
  expect_error<zt::ConfigError>([&] { SwapFile(dir.path() + "/a.swp", 1 << 20, o, log.fn()); }, {"aio.thread_count"});
  const std::string missing = dir.path() + "/no_such_dir/a.swp";
  expect_error<zt::ConfigError>([&] { SwapFile(missing, 1 << 20, AioOptions{}, log.fn()); }, {missing, "nvme_path"});
  EXPECT_TRUE(dir.empty());
}

TEST(Aio, FullDiskNamesPathAndBytes) {
  struct statfs sfs {};
  // tmpfs preallocates for real and fails fast; other filesystems might emulate slowly.
  if (::statfs("/dev/shm", &sfs) != 0 || sfs.f_type != TMPFS_MAGIC) GTEST_SKIP() << "/dev/shm is not a tmpfs";
  TempDir dir("/dev/shm");
  const std::string p = dir.path() + "/huge.swp";
  LogSink log;
  expect_error<zt::ConfigError>([&] { SwapFile(p, int64_t{1} << 44, AioOptions{}, log.fn()); },
                                {p, "17592186044416 bytes", "not enough space"});
  EXPECT_FALSE(file_exists(p)) << "a failed swap file must not be left behind";
}

TEST(Aio, IoErrorsNameFileOperationAndOffset) {
  // Truncating the swap file behind its back makes reads hit end-of-file: the error must
  // come out of wait() naming the file, the operation and the offset, for both engines.
  TempDir dir(test_base());
  for (bool threads : {false, true}) {
    SCOPED_TRACE(threads ? "threads" : "default engine");
    LogSink log;
    AioOptions o;
    o.force_threads = threads;
    o.block_size = 64 * 1024;
    SwapFile f(dir.path() + "/trunc.swp", 1 << 20, o, log.fn());
    AlignedBuffer b(1 << 20);
    fill_random(b, 5);
    f.wait(f.write_async(0, b.data(), 1 << 20));
    ASSERT_EQ(::truncate(f.path().c_str(), 256 * 1024), 0);
    const uint64_t t = f.read_async(0, b.data(), 1 << 20);
    expect_error<zt::Error>([&] { f.wait(t); }, {f.path(), "read", "at offset ", "end of file"});
    f.read_async(512 * 1024, b.data(), 64 * 1024);
    expect_error<zt::Error>([&] { f.wait_all(); }, {f.path(), "offset 524288", "65536 bytes"});
  }
}

TEST(Aio, SwapFileIsMovableAndRemovedOnDestruction) {
  TempDir dir(test_base());
  LogSink log;
  std::string path;
  {
    SwapFile a(dir.path() + "/m.swp", 8192, AioOptions{}, log.fn());
    path = a.path();
    SwapFile b(std::move(a));
    AlignedBuffer x(8192), y(8192);
    fill_random(x, 9);
    b.wait(b.write_async(0, x.data(), 8192));
    SwapFile c = std::move(b);
    c.wait(c.read_async(0, y.data(), 8192));
    EXPECT_EQ(std::memcmp(x.data(), y.data(), 8192), 0);
    EXPECT_TRUE(file_exists(path));
  }
  EXPECT_FALSE(file_exists(path));
}

TEST(Aio, CheckNvmePath) {
  using zt::offload::check_nvme_path;
  const std::string key = "zero_optimization.offload_optimizer.nvme_path";
  TempDir dir(test_base());
  EXPECT_NO_THROW(check_nvme_path(key, dir.path(), 1 << 20));
  EXPECT_TRUE(dir.empty()) << "the probe file must be removed";

  const std::string missing = dir.path() + "/missing";
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, missing, 0); },
                                {key, "'" + missing + "' does not exist", "create it"});
  const std::string file = dir.path() + "/a_file";
  ::close(::open(file.c_str(), O_CREAT | O_WRONLY, 0600));
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, file, 0); }, {key, file, "not a directory"});
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, file + "/sub", 0); },
                                {key, file + "/sub", "not a directory"});
  ::unlink(file.c_str());
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, "", 0); }, {key, "empty"});
  // Root ignores permission bits, so unwritable means a pseudo filesystem.
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, "/proc/zerotrain_nvme_test", 0); },
                                {"/proc/zerotrain_nvme_test", "does not exist"});
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, "/proc", 0); }, {key, "'/proc'", "not writable"});
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, "/sys", 0); }, {key, "'/sys'", "not writable"});
  expect_error<zt::ConfigError>([&] { check_nvme_path(key, dir.path(), int64_t{1} << 62); },
                                {key, dir.path(), "free", "4611686018427387904 bytes"});
  EXPECT_TRUE(dir.empty());
}

}  // namespace zt_test_aio

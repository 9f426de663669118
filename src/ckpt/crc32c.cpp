#include "ckpt/crc32c.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include "zerotrain/error.h"

namespace zt::ckpt {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // Castagnoli, reflected

// table[k][b]: CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t{};
  Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPoly : c >> 1;
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
  }
};
const Tables& tables() {
  static const Tables t;
  return t;
}

uint32_t crc_sw(uint32_t c, const unsigned char* p, size_t n) {
  const auto& t = tables().t;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);  // little-endian hosts only (x86-64, aarch64)
    v ^= c;
    c = t[7][v & 0xFF] ^ t[6][(v >> 8) & 0xFF] ^ t[5][(v >> 16) & 0xFF] ^ t[4][(v >> 24) & 0xFF] ^
        t[3][(v >> 32) & 0xFF] ^ t[2][(v >> 40) & 0xFF] ^ t[1][(v >> 48) & 0xFF] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_hw(uint32_t c, const unsigned char* p, size_t n) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    n -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (n--) c = _mm_crc32_u8(c, *p++);
  return c;
}
bool have_hw() {
  static const bool h = __builtin_cpu_supports("sse4.2");
  return h;
}
#endif

}  // namespace

uint32_t crc32c(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_hw()) return ~crc_hw(c, p, n);
#endif
  return ~crc_sw(c, p, n);
}

uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n) {
  return ~crc_sw(~crc, static_cast<const unsigned char*>(data), n);
}

FileDigest file_crc32c(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ZT_CHECK_T(fd >= 0, CheckpointError, "cannot open checkpoint file '", path, "': ", std::strerror(errno));
  FileDigest d;
  std::vector<unsigned char> buf(8 << 20);
  for (;;) {
    ssize_t got = ::read(fd, buf.data(), buf.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      int e = errno;
      ::close(fd);
      throw CheckpointError(detail::cat("cannot read checkpoint file '", path, "': ", std::strerror(e)));
    }
    if (got == 0) break;
    d.crc = crc32c(d.crc, buf.data(), static_cast<size_t>(got));
    d.bytes += static_cast<uint64_t>(got);
  }
  ::close(fd);
  return d;
}

std::string crc_hex(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", crc);
  return s;
}

}  // namespace zt::ckpt

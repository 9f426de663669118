// CRC-32C: the standard check value, and chunked == whole at odd sizes and offsets.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ckpt/crc32c.h"

namespace zt_test_crc32c {

TEST(Crc32c, StandardCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(zt::ckpt::crc32c(0, s.data(), s.size()), 0xE3069283u);
  EXPECT_EQ(zt::ckpt::crc32c(0, nullptr, 0), 0u);
  EXPECT_EQ(zt::ckpt::crc_hex(0xE3069283u), "e3069283");
}

TEST(Crc32c, ChunkedEqualsWholeAndDetectsOneBit) {
  std::vector<unsigned char> buf(10007);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<unsigned char>(i * 131 + 7);
  const uint32_t whole = zt::ckpt::crc32c(0, buf.data(), buf.size());
  for (size_t cut : {1u, 7u, 8u, 9u, 4096u, 10006u}) {
    uint32_t c = zt::ckpt::crc32c(0, buf.data(), cut);
    c = zt::ckpt::crc32c(c, buf.data() + cut, buf.size() - cut);
    EXPECT_EQ(c, whole) << "cut at " << cut;
  }
  EXPECT_EQ(zt::ckpt::crc32c_portable(0, buf.data(), buf.size()), whole) << "table and SSE4.2 paths differ";
  EXPECT_EQ(zt::ckpt::crc32c_portable(0, "123456789", 9), 0xE3069283u);
  buf[5000] ^= 0x10;
  EXPECT_NE(zt::ckpt::crc32c(0, buf.data(), buf.size()), whole);
}

}  // namespace zt_test_crc32c

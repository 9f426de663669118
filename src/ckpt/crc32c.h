// CRC-32C (Castagnoli, the iSCSI / ext4 / RocksDB checksum) of byte ranges, for
// checkpoint file verification. Uses the SSE4.2 crc32 instruction when the CPU has it
// (several GB/s), else a slicing-by-8 table (~1 GB/s); both give the same value.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zt::ckpt {

// Extends `crc` (start with 0) over [data, data + n).
uint32_t crc32c(uint32_t crc, const void* data, size_t n);
// The table version alone (what crc32c uses without SSE4.2); for tests.
uint32_t crc32c_portable(uint32_t crc, const void* data, size_t n);

// CRC-32C of a whole file, and its size in bytes. Throws zt::CheckpointError naming the
// file when it cannot be read.
struct FileDigest {
  uint32_t crc = 0;
  uint64_t bytes = 0;
};
FileDigest file_crc32c(const std::string& path);

// "1a2b3c4d" (8 lowercase hex digits), as stored in the manifest.
std::string crc_hex(uint32_t crc);

}  // namespace zt::ckpt

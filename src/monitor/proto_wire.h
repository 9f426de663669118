// The few pieces of protobuf's wire format that the monitor files encode by hand (the
// TensorBoard Event in tfevents.cpp, wandb's Record in wandb_writer.cpp), shared so the
// two encoders cannot drift apart. https://protobuf.dev/programming-guides/encoding/
//
// A message is a sequence of fields, each a key varint((field_number << 3) | wire_type)
// and a value: wire type 0 a varint, 1 eight little-endian bytes, 2 a varint length and
// that many bytes (strings and nested messages), 5 four little-endian bytes. proto3
// leaves out scalars and strings equal to their default (0, ""), and protobuf's own
// serializers write the fields in field-number order: encoding in that order too makes
// the bytes equal to theirs, which the tests compare.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace zt::monitor::wire {

inline void put_fixed64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
inline void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
inline void put_key(std::string& out, int field, int wire_type) {
  put_varint(out, (uint64_t(field) << 3) | uint64_t(wire_type));
}
// int32 and int64 fields: a negative value is sign-extended to 64 bits (ten bytes).
// Callers leave out default values themselves where proto3 does (see above).
inline void put_int(std::string& out, int field, int64_t v) {
  put_key(out, field, 0);
  put_varint(out, static_cast<uint64_t>(v));
}
// Strings, bytes and nested messages. A nested message that is set is written even when
// empty (message fields have presence: `step {}` is not the same as no step).
inline void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}
inline void put_double(std::string& out, int field, double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  put_key(out, field, 1);
  put_fixed64(out, bits);
}
inline void put_float(std::string& out, int field, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  put_key(out, field, 5);
  put_fixed32(out, bits);
}

}  // namespace zt::monitor::wire

// Reads typed values from a fuzzer's bytes. Small values are one byte and edge values have
// their own tags, so the fuzzer reaches valid shapes (and the limits around them) quickly.
// Past the end every read gives zero: any input is a complete test case.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace flashjit::fuzz {

class FuzzInput {
 public:
  FuzzInput(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}

  std::uint8_t byte() { return used_ < size_ ? data_[used_++] : 0; }
  bool flag() { return byte() & 1; }

  template <typename T>
  T raw() {
    unsigned char bytes[sizeof(T)] = {};
    for (auto& b : bytes) b = byte();
    T value;
    std::memcpy(&value, bytes, sizeof(T));
    return value;
  }

  // Mostly small (-16..223); a tag byte >= 0xf0 selects an edge case or raw bytes.
  std::int64_t integer() {
    const std::uint8_t tag = byte();
    if (tag < 0xf0) return std::int64_t{tag} - 16;
    using limits = std::numeric_limits<std::int64_t>;
    switch (tag & 0x0f) {
      case 0:
        return raw<std::int64_t>();
      case 1:
        return limits::max() - byte();
      case 2:
        return limits::min() + byte();
      case 3:
        return std::int64_t{std::numeric_limits<std::int32_t>::max()} +
               static_cast<std::int8_t>(byte());
      case 4:
        return 65535 + static_cast<std::int8_t>(byte());
      case 5:
        return raw<std::int32_t>();
      case 6:
        return std::int64_t{byte()} * 8;
      case 7:
        return std::int64_t{byte()} * 4096;
      case 8:
        return std::int64_t{1} << (byte() % 63);
      default:
        return std::int64_t{byte()} * 32;
    }
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t used_ = 0;
};

}  // namespace flashjit::fuzz

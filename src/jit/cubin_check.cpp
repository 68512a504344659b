#include "jit/cubin_check.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

#include "core/arch.hpp"

namespace flashjit::detail {
namespace {

constexpr std::uint16_t kMachineCuda = 190;  // EM_CUDA
constexpr std::size_t kHeaderBytes = 64;     // Elf64_Ehdr

template <typename T>
T read_le(std::string_view bytes, std::size_t offset) {
  T value{};
  std::memcpy(&value, bytes.data() + offset, sizeof(T));  // x86-64 and aarch64 hosts: little end
  return value;
}

}  // namespace

std::string cubin_mismatch(std::string_view cubin, std::string_view arch) {
  if (cubin.size() < kHeaderBytes || cubin.substr(0, 4) !=
                                         "\x7f"
                                         "ELF")
    return "not an ELF file";
  if (cubin[4] != 2) return "not a 64-bit ELF";
  if (read_le<std::uint16_t>(cubin, 18) != kMachineCuda)
    return "an ELF for another machine, not CUDA";
  // e_flags holds the SM: bits 8-15 from ABI version 8 on (CUDA 12.8+), bits 0-7 before.
  const unsigned abi_version = static_cast<unsigned char>(cubin[8]);
  const std::uint32_t flags = read_le<std::uint32_t>(cubin, 48);
  const int sm = static_cast<int>(abi_version >= 8 ? (flags >> 8) & 0xff : flags & 0xff);
  if (sm != arch_number(arch)) return fmt::format("a cubin for SM {}, not {}", sm, arch);
  return {};
}

}  // namespace flashjit::detail

// Prints the version and compiles one variant: the installed library and headers work alone.
#include <flashjit/flashjit.hpp>

#include <cstdio>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  flashjit::KernelCache cache(flashjit::CacheOptions{argv[1]});
  const auto outcome = cache.compile(flashjit::Variant::parse("simt.sm80.bf16.d64.m64n64s1"));
  std::printf("flashjit %s: %s\n", std::string(flashjit::version()).c_str(),
              outcome.ok ? "compiled" : outcome.error.c_str());
  return outcome.ok ? 0 : 1;
}

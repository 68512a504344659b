// Replays fuzz corpora through a harness: every file under the directories (or the files) named
// on the command line goes to LLVMFuzzerTestOneInput once. Built with the normal compiler, so
// ctest runs each kept corpus as a regression test on machines without clang.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    if (fs::is_directory(arg)) {
      for (const auto& item : fs::recursive_directory_iterator(arg))
        if (item.is_regular_file()) inputs.push_back(item.path());
    } else if (fs::is_regular_file(arg)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "no such corpus: %s\n", arg.c_str());
      return 1;
    }
  }
  // An empty corpus would pass while testing nothing.
  if (inputs.empty()) {
    std::fprintf(stderr, "no corpus inputs given\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  for (const fs::path& path : inputs) {
    std::ifstream file(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(file)),
                            std::istreambuf_iterator<char>());
    // A crash or abort below leaves this line as the last one: it names the input.
    std::fprintf(stderr, "replaying %s\n", path.c_str());
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replayed %zu inputs without a failure\n", inputs.size());
  return 0;
}

// The main of a fuzz target in the normal build (no libFuzzer): runs every
// file named on the command line, and every file in the directories named
// there, through LLVMFuzzerTestOneInput once, then an empty input. So the
// seed corpora, and the inputs of the findings fixed, are replayed by
// ctest in every build (tests/fuzz/README.md).
//
//   frame_fuzz_replay tests/fuzz/corpus/frame [more files or directories]
//
// Exits 1 when an argument cannot be read or names an empty directory; a
// finding crashes, as under libFuzzer.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
// Optional, as in libFuzzer.
extern "C" __attribute__((weak)) int LLVMFuzzerInitialize(int* argc, char*** argv);

namespace {

// Runs one file; false when it cannot be read.
bool RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return false;
  // A buffer of exactly the input's size, so that a sanitizer build sees a
  // read past its end.
  std::unique_ptr<uint8_t[]> copy(new uint8_t[std::max<size_t>(bytes.size(), 1)]);
  std::memcpy(copy.get(), bytes.data(), bytes.size());
  LLVMFuzzerTestOneInput(copy.get(), bytes.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR_OR_FILE...\n", argv[0]);
    return 1;
  }
  int runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path arg(argv[i]);
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(arg, ec)) {
      for (const auto& entry : std::filesystem::directory_iterator(arg, ec)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
      if (ec || files.empty()) {
        std::fprintf(stderr, "%s: %s\n", argv[i],
                     ec ? ec.message().c_str() : "no files (wrong corpus directory?)");
        return 1;
      }
      std::sort(files.begin(), files.end());
    } else {
      files.push_back(arg);
    }
    for (const auto& file : files) {
      if (!RunFile(file)) {
        std::fprintf(stderr, "%s: cannot read\n", file.c_str());
        return 1;
      }
      ++runs;
    }
  }
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(""), 0);
  std::printf("%s: %d inputs and the empty one ran without a finding\n", argv[0], runs);
  return 0;
}

// The whole contents of a file, for tests ("" when it cannot be read).
#ifndef STRATA_TESTS_TESTING_READ_FILE_H_
#define STRATA_TESTS_TESTING_READ_FILE_H_

#include <fstream>
#include <sstream>
#include <string>

namespace strata::testing {

inline std::string ReadFileForTesting(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace strata::testing

#endif  // STRATA_TESTS_TESTING_READ_FILE_H_

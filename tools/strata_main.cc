// strata: the operator CLI.
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "tools/cli.h"

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return strata::tools::RunCli(args, std::cout, std::cerr, ::getenv);
}

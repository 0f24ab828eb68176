// strata-gen-ctr: synthetic Criteo-format CTR data from a planted logistic
// model, with its best achievable test AUC and log-loss. See tools/ctr_gen.h.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "glog/logging.h"
#include "storage/file_system.h"
#include "tools/ctr_gen.h"

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  std::vector<std::string> args(argv + 1, argv + argc);
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") {
      std::cout << strata::tools::kCtrGenUsage;
      return 0;
    }
  }
  if (args.size() == 1 && args[0].rfind("--config=", 0) == 0) {
    args = {"--config", args[0].substr(9)};
  }
  if (args.size() == 2 && args[0] == "--config") {
    auto flags = strata::tools::CtrGenFlagsFromConfig(args[1]);
    if (!flags.ok()) {
      std::cerr << "strata-gen-ctr: " << flags.status().message() << "\n";
      return 2;
    }
    if (flags->empty()) {
      std::printf("strata-gen-ctr: %s has no data.generate section: nothing to generate\n",
                  args[1].c_str());
      return 0;
    }
    args = *flags;
  }
  auto options = strata::tools::ParseCtrGenFlags(args);
  if (!options.ok()) {
    std::cerr << "strata-gen-ctr: " << options.status().message() << "\n"
              << strata::tools::kCtrGenUsage;
    return 2;
  }

  auto fs = strata::storage::NewPosixFileSystem();
  strata::tools::CtrGenSummary summary;
  const absl::Time start = absl::Now();
  if (auto s = strata::tools::GenerateCtrData(*options, fs.get(), &summary); !s.ok()) {
    std::cerr << "strata-gen-ctr: " << s.message() << "\n";
    return 1;
  }
  if (summary.already_existed) {
    std::printf("strata-gen-ctr: data already in %s, nothing written\n", options->out_dir.c_str());
    return 0;
  }
  std::printf(
      "strata-gen-ctr: wrote %lld train + %lld test rows to %s (%.1f MiB, "
      "%.2f s): mean CTR %.4f, planted test AUC %.4f, log-loss %.4f\n",
      static_cast<long long>(summary.train_rows), static_cast<long long>(summary.test_rows),
      options->out_dir.c_str(), summary.bytes_written / 1048576.0,
      absl::ToDoubleSeconds(absl::Now() - start), summary.mean_ctr, summary.planted_test_auc,
      summary.planted_test_logloss);
  return 0;
}

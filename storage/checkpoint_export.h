// Inference exports of a checkpoint: the parameters only (no optimizer
// state, no admission counts), each value in 16 bits (bf16 or fp16), one
// full file per partition and a manifest marked with the precision
// (docs/checkpoint-format.md). For serving; a job cannot resume from one.
#ifndef STRATA_STORAGE_CHECKPOINT_EXPORT_H_
#define STRATA_STORAGE_CHECKPOINT_EXPORT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/checkpoint.pb.h"
#include "storage/file_system.h"

namespace strata::storage {

enum class Precision { kBf16, kFp16 };

// "bf16" | "fp16"; InvalidArgument otherwise.
absl::StatusOr<Precision> ParsePrecision(const std::string& name);

// Round to nearest even; NaN stays NaN, beyond the range becomes infinity
// (fp16 also has subnormals).
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToFp16(float f);
float Fp16ToFloat(uint16_t h);

// Reads checkpoint `src_dir` whole (its chains applied, every checksum
// checked) and writes its export to `dst_dir` (created; its parent is the
// export's root): the manifest last, as for a checkpoint. Returns the
// export's manifest. Errors name the file.
absl::StatusOr<proto::CheckpointManifest> ExportCheckpoint(FileSystem* fs,
                                                           const std::string& src_dir,
                                                           const std::string& dst_dir,
                                                           Precision precision, int zstd_level = 3);

}  // namespace strata::storage

#endif  // STRATA_STORAGE_CHECKPOINT_EXPORT_H_

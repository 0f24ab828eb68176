// Choosing the worker's device (worker.device in the config): the CPU, the
// GPU, or the GPU when there is one.
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "worker/device.h"

#ifdef STRATA_WITH_CUDA
namespace strata::worker::cuda {
int VisibleGpuCount(std::string* why);
absl::StatusOr<std::unique_ptr<Device>> NewDevice(int gpu, Precision precision);
}  // namespace strata::worker::cuda
#endif

namespace strata::worker {

bool CudaCompiledIn() {
#ifdef STRATA_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int VisibleGpus(std::string* why) {
#ifdef STRATA_WITH_CUDA
  return cuda::VisibleGpuCount(why);
#else
  if (why != nullptr) {
    *why = "this build has no CUDA (STRATA_WITH_CUDA off: nvcc was not found at configure time)";
  }
  return 0;
#endif
}

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int gpu, Precision precision) {
#ifdef STRATA_WITH_CUDA
  return cuda::NewDevice(gpu, precision);
#else
  (void)gpu;
  (void)precision;
  std::string why;
  VisibleGpus(&why);
  return absl::FailedPreconditionError(why);
#endif
}

absl::StatusOr<std::unique_ptr<Device>> NewDevice(const DeviceChoice& choice, std::string* note) {
  if (choice.device == "cpu") return NewCpuDevice(choice.cpu_threads);
  if (choice.device == "cuda") {
    absl::StatusOr<std::unique_ptr<Device>> d = NewCudaDevice(choice.gpu, choice.precision);
    if (!d.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker.device is cuda but ", d.status().message(),
                       " (set worker.device: cpu or auto to train on the CPU)"));
    }
    return d;
  }
  if (choice.device != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown worker.device '", choice.device, "' (auto, cpu or cuda)"));
  }
  std::string why;
  if (VisibleGpus(&why) > 0) {
    absl::StatusOr<std::unique_ptr<Device>> d = NewCudaDevice(choice.gpu, choice.precision);
    if (d.ok()) {
      if (note != nullptr) *note = absl::StrCat("device auto: ", (*d)->Describe());
      return d;
    }
    why = std::string(d.status().message());
  }
  std::unique_ptr<Device> cpu = NewCpuDevice(choice.cpu_threads);
  if (note != nullptr) *note = absl::StrCat("device auto: ", cpu->Describe(), " (", why, ")");
  return cpu;
}

void PinTensors(Device* device, std::vector<std::vector<float>>* tensors) {
  if (device->host_memory()) return;
  for (auto& t : *tensors) {
    if (t.empty()) continue;  // a sparse table's: rows come per batch
    absl::Status s = device->PinHost(t.data(), t.size() * sizeof(float));
    if (!s.ok()) LOG(WARNING) << "a model tensor stays unpinned: " << s;
  }
}

void UnpinTensors(Device* device, std::vector<std::vector<float>>* tensors) {
  if (device->host_memory()) return;
  for (auto& t : *tensors) {
    if (!t.empty()) device->UnpinHost(t.data());
  }
}

void PinModelTensors(Device* device, std::vector<std::vector<float>>* params,
                     std::vector<std::vector<float>>* grads) {
  PinTensors(device, params);
  PinTensors(device, grads);
}

void UnpinModelTensors(Device* device, std::vector<std::vector<float>>* params,
                       std::vector<std::vector<float>>* grads) {
  if (device->host_memory()) return;
  (void)device->Synchronize();
  UnpinTensors(device, params);
  UnpinTensors(device, grads);
}

absl::Status ReserveModelArrays(Device* device, const std::vector<std::vector<float>>& params,
                                const std::vector<std::vector<float>>& grads,
                                std::vector<DeviceArray<float>>* d_params,
                                std::vector<DeviceArray<float>>* d_grads) {
  if (!d_params->empty()) return absl::OkStatus();
  for (size_t t = 0; t < params.size(); ++t) {
    d_params->emplace_back(device);
    d_grads->emplace_back(device);
    STRATA_RETURN_IF_ERROR(d_params->back().Reserve(params[t].size()));
    STRATA_RETURN_IF_ERROR(d_grads->back().Reserve(grads[t].size()));
  }
  return absl::OkStatus();
}

}  // namespace strata::worker

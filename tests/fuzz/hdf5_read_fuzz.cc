// libFuzzer target: an HDF5 file as `lifeline convert` imports one (OpenTensorSource on the file:
// the signature check, Hdf5File::OpenReadOnly, the scan of the lifeline-hdf5/1 layout or of plain
// datasets), then every tensor and object read. It must never crash or let an exception out; a
// hostile file is refused with a Status. libhdf5 itself is not instrumented: the fuzzer steers by
// the coverage of Lifeline's code around it.
//
// Input: the file's bytes, written to a temporary file (HDF5 reads through its own I/O layer).
// An HDF5 identifier left open afterwards is a failure. Tensors are read whole up to 1 MiB, larger ones only their first 64 Ki elements, so a file
// cannot make the harness itself allocate without bound.
#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "lifeline/dtype.h"
#include "lifeline/convert.h"

namespace {

const std::string& TempPath() {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/lifeline_hdf5_fuzz." +
           std::to_string(::getpid()) + ".h5";
  }();
  return path;
}

bool WriteFile(const std::string& path, const uint8_t* data, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool ok = std::fwrite(data, 1, size, f) == size;
  return std::fclose(f) == 0 && ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lifeline;
  const std::string& path = TempPath();
  if (!WriteFile(path, data, size)) std::abort();
  {
    Result<std::unique_ptr<TensorSource>> source = OpenTensorSource(path, SourceOptions{});
    if (source.ok()) {
      TensorSource& s = **source;
      std::vector<uint8_t> buffer;
      for (size_t i = 0; i < s.tensors().size(); ++i) {
        const SourceTensor& t = s.tensors()[i];
        const int64_t volume = t.num_elements();
        TensorRegion region;
        region.offsets.assign(t.shape.size(), 0);
        region.shape = t.shape;
        region.flat_end = t.num_bytes() <= (1u << 20) ? volume : std::min<int64_t>(volume, 1 << 16);
        buffer.assign(static_cast<size_t>(region.flat_end) * DTypeSize(t.dtype), 0);
        (void)s.Read(i, region, buffer.data());
      }
      for (size_t i = 0; i < s.objects().size(); ++i) (void)s.ReadObject(i);
    }
  }
  // Every file, group, dataset and attribute opened on the way is closed again, errors included:
  // an identifier left open keeps its file open in HDF5 for the rest of the process.
  if (H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL) != 0) std::abort();
  std::remove(path.c_str());
  return 0;
}

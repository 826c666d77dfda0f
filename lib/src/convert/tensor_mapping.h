// What `lifeline convert --rename/--rename-file/--dtype` do between the source and the writer:
// the rename rules and the planning of lifeline/convert.h (ParseRenameRule, ParseRenameRules,
// PlanExportTensors) and MappedTensorSource, the source the exporters then read, which shows the
// planned tensors under their new names and dtypes and casts slab by slab as they are read.
#ifndef LIFELINE_LIB_SRC_CONVERT_TENSOR_MAPPING_H_
#define LIFELINE_LIB_SRC_CONVERT_TENSOR_MAPPING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "lifeline/convert.h"
#include "lifeline/status.h"

namespace lifeline {

// "PATTERN=REPLACEMENT", as --rename takes it and errors quote it.
std::string RenameRuleText(const RenameRule& rule);

// The tensors of `plan` (PlanExportTensors over `inner`) read from `inner`: tensor i of this source
// is plan[i], named plan[i].name, of dtype plan[i].dtype. A cast tensor is read from `inner` in
// pieces of at most `scratch_bytes` of its source dtype and cast into the caller's buffer, so a
// read costs the caller's buffer plus at most scratch_bytes (at least one element). Everything else
// (objects, metadata, step, world size, description, kind) is `inner`'s.
//
// Thread safety: as any TensorSource, one thread at a time; `inner` must outlive it and is used
// only through it meanwhile.
class MappedTensorSource : public TensorSource {
 public:
  MappedTensorSource(TensorSource& inner, std::vector<ExportTensor> plan, uint64_t scratch_bytes);

  const std::vector<ExportTensor>& plan() const { return plan_; }
  Result<std::string> ReadObject(size_t object) override { return inner_.ReadObject(object); }

 protected:
  Status ReadRegion(size_t tensor, const TensorRegion& region, void* dst) override;

 private:
  TensorSource& inner_;
  const std::vector<ExportTensor> plan_;
  const uint64_t scratch_bytes_;
  std::vector<uint8_t> scratch_;  // a piece of a cast tensor in its source dtype
};

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_TENSOR_MAPPING_H_

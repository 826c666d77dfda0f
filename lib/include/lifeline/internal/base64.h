// Base64 (RFC 4648, with padding): objects in safetensors metadata, keys and values in etcd's
// JSON gateway. Part of the declared internal interface (lifeline/internal/) the agent and tools
// may use; implemented in the base layer (lib/base/base64.cc).
#ifndef LIFELINE_INTERNAL_BASE64_H_
#define LIFELINE_INTERNAL_BASE64_H_

#include <string>
#include <string_view>

#include "lifeline/status.h"

namespace lifeline {

std::string Base64Encode(std::string_view bytes);
// Corruption naming the position of the first character that is not base64, or the length when
// it is not a multiple of 4.
Result<std::string> Base64Decode(std::string_view text);

}  // namespace lifeline

#endif  // LIFELINE_INTERNAL_BASE64_H_

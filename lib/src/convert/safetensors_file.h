// A safetensors file's header read through the Env: the I/O half of formats/safetensors.h, whose
// decoders (DecodeSafetensorsHeaderLength, ParseSafetensorsHeader) are pure and see only bytes.
//
// Thread safety: ReadSafetensorsHeader reads one file; calls on different files may run at once.
#ifndef LIFELINE_LIB_SRC_CONVERT_SAFETENSORS_FILE_H_
#define LIFELINE_LIB_SRC_CONVERT_SAFETENSORS_FILE_H_

#include "formats/safetensors.h"
#include "lifeline/env.h"
#include "lifeline/status.h"

namespace lifeline {

// Reads the length field and the header of `file` and parses them; the data buffer is not read.
// The caller opens the file through its Env (OpenTensorSource opens a user's file once, refusing
// what is not a regular file, and reads the header and then the tensors through it). Corruption
// (naming the file) when it is shorter than 8 bytes, when N exceeds kMaxSafetensorsHeaderBytes or
// runs past the end of the file, or when the header is invalid (see ParseSafetensorsHeader);
// ResourceExhausted when the header's bytes cannot be allocated; the file's own errors (IOError,
// Corruption for a short read) when it cannot be read.
Result<format::SafetensorsHeader> ReadSafetensorsHeader(const RandomAccessFile& file);

}  // namespace lifeline

#endif  // LIFELINE_LIB_SRC_CONVERT_SAFETENSORS_FILE_H_

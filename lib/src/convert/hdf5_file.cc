#include "lib/src/convert/hdf5_file.h"

#include <hdf5.h>
#include <sys/stat.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>

#include "formats/index_codec.h"

// In-memory elements are little-endian host values; the memory types below say so explicitly.
static_assert(std::endian::native == std::endian::little, "Hdf5File assumes a little-endian host");

namespace lifeline {
namespace {

constexpr size_t kMaxRank = 32;
// Chunk cache of an open dataset: large enough that partial chunks written by successive
// WriteRegion calls stay in memory until they are complete.
constexpr size_t kChunkCacheBytes = 32u << 20;
constexpr size_t kChunkCacheSlots = 10007;  // prime, as HDF5 recommends

// Owns one HDF5 identifier and closes it with the matching H5?close.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer) : id_(id), closer_(closer) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)), closer_(o.closer_) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      Reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
      closer_ = o.closer_;
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { Reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  // Closes now and reports HDF5's verdict (a dataset close may flush cached chunks).
  herr_t Close() {
    herr_t r = 0;
    if (id_ >= 0 && closer_ != nullptr) r = closer_(id_);
    id_ = H5I_INVALID_HID;
    return r;
  }
  void Reset() { Close(); }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

Hid TypeHid(hid_t id) { return Hid(id, H5Tclose); }
Hid SpaceHid(hid_t id) { return Hid(id, H5Sclose); }
Hid PlistHid(hid_t id) { return Hid(id, H5Pclose); }

void DisableErrorPrinting() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

herr_t InnermostErrorCallback(unsigned n, const H5E_error2_t* err, void* data) {
  if (n != 0) return 0;
  auto* out = static_cast<std::string*>(data);
  if (err->desc != nullptr && err->desc[0] != '\0') {
    *out = err->desc;
  } else {
    char minor[256] = {0};
    H5E_type_t type;
    if (H5Eget_msg(err->min_num, &type, minor, sizeof(minor)) > 0) *out = minor;
  }
  return 0;
}

// The description of the innermost error on HDF5's default stack, i.e. where the failure was
// first detected. Must run before any other HDF5 call, which would clear the stack.
std::string InnermostHdf5Error() {
  std::string desc;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, InnermostErrorCallback, &desc);
  return desc.empty() ? std::string("no detail on the HDF5 error stack") : desc;
}

std::string Quote(std::string_view name) { return "'" + std::string(name) + "'"; }

std::string JoinInts(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(v[i]);
  }
  return s + "]";
}

bool MulOverflows(int64_t a, int64_t b, int64_t* out) { return __builtin_mul_overflow(a, b, out); }

// "a/b", "/a/b" -> "a/b"; "/" -> "/" when a group is meant. Empty components, "." and ".."
// and NUL bytes are rejected so that a name means one object.
Result<std::string> NormalizePath(const std::string& file, const std::string& path, bool allow_root) {
  std::string_view p(path);
  if (!p.empty() && p.front() == '/') p.remove_prefix(1);
  if (p.empty()) {
    if (allow_root) return std::string("/");
    return Status::InvalidArgument(file, "empty dataset path " + Quote(path));
  }
  if (p.find('\0') != std::string_view::npos)
    return Status::InvalidArgument(file, "path " + Quote(path) + " contains a NUL byte");
  size_t pos = 0;
  while (true) {
    size_t next = p.find('/', pos);
    std::string_view part = p.substr(pos, next == std::string_view::npos ? std::string_view::npos : next - pos);
    if (part.empty() || part == "." || part == "..")
      return Status::InvalidArgument(file, "path " + Quote(path) + " has an empty, '.' or '..' component");
    if (next == std::string_view::npos) break;
    pos = next + 1;
  }
  return std::string(p);
}

// ---- types ----

bool IsRawBitsDType(DType t) { return t == DType::kBF16 || t == DType::kF8E4M3 || t == DType::kF8E5M2; }

Hid MakeHalfType() {
  Hid t = TypeHid(H5Tcopy(H5T_IEEE_F32LE));
  if (!t.valid()) return t;
  // Fields first (they must fit the current 32-bit precision), then shrink to 2 bytes.
  if (H5Tset_fields(t.get(), 15, 10, 5, 0, 10) < 0 || H5Tset_size(t.get(), 2) < 0 ||
      H5Tset_precision(t.get(), 16) < 0 || H5Tset_ebias(t.get(), 15) < 0)
    return Hid();
  return t;
}

Hid MakeBoolType() {
  Hid t = TypeHid(H5Tenum_create(H5T_STD_I8LE));
  if (!t.valid()) return t;
  int8_t no = 0, yes = 1;
  if (H5Tenum_insert(t.get(), "FALSE", &no) < 0 || H5Tenum_insert(t.get(), "TRUE", &yes) < 0) return Hid();
  return t;
}

// The HDF5 type that both stores `t` and describes it in memory. Invalid on failure.
Hid TypeFor(DType t) {
  switch (t) {
    case DType::kF64: return TypeHid(H5Tcopy(H5T_IEEE_F64LE));
    case DType::kF32: return TypeHid(H5Tcopy(H5T_IEEE_F32LE));
    case DType::kF16: return MakeHalfType();
    case DType::kBF16: return TypeHid(H5Tcopy(H5T_STD_U16LE));
    case DType::kF8E4M3:
    case DType::kF8E5M2: return TypeHid(H5Tcopy(H5T_STD_U8LE));
    case DType::kI64: return TypeHid(H5Tcopy(H5T_STD_I64LE));
    case DType::kI32: return TypeHid(H5Tcopy(H5T_STD_I32LE));
    case DType::kI16: return TypeHid(H5Tcopy(H5T_STD_I16LE));
    case DType::kI8: return TypeHid(H5Tcopy(H5T_STD_I8LE));
    case DType::kU8: return TypeHid(H5Tcopy(H5T_STD_U8LE));
    case DType::kBool: return MakeBoolType();
  }
  return Hid();
}

bool PlainByteOrder(hid_t type) {
  H5T_order_t order = H5Tget_order(type);
  return order == H5T_ORDER_LE || order == H5T_ORDER_BE;
}

// Size in bytes when `type` is an IEEE binary16/32/64 float (either byte order), else 0.
size_t IeeeFloatSize(hid_t type) {
  if (H5Tget_class(type) != H5T_FLOAT || !PlainByteOrder(type)) return 0;
  size_t size = H5Tget_size(type);
  size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
  if (H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize) < 0) return 0;
  if (H5Tget_offset(type) != 0 || H5Tget_precision(type) != size * 8 || mpos != 0) return 0;
  size_t ebias = H5Tget_ebias(type);
  struct Layout { size_t size, esize, msize, ebias; };
  for (Layout l : {Layout{2, 5, 10, 15}, Layout{4, 8, 23, 127}, Layout{8, 11, 52, 1023}}) {
    if (size == l.size && esize == l.esize && msize == l.msize && ebias == l.ebias && epos == msize &&
        spos == size * 8 - 1)
      return size;
  }
  return 0;
}

// A 1-byte integer enum with exactly the members FALSE=0 and TRUE=1 (h5py's numpy bool).
bool IsBoolEnum(hid_t type) {
  if (H5Tget_class(type) != H5T_ENUM || H5Tget_size(type) != 1 || H5Tget_nmembers(type) != 2) return false;
  bool seen_false = false, seen_true = false;
  for (unsigned i = 0; i < 2; ++i) {
    char* name = H5Tget_member_name(type, i);
    if (name == nullptr) return false;
    std::string n(name);
    H5free_memory(name);
    uint8_t value = 0;  // the base type's representation: one byte
    if (H5Tget_member_value(type, i, &value) < 0) return false;
    if (n == "FALSE" && value == 0) seen_false = true;
    if (n == "TRUE" && value == 1) seen_true = true;
  }
  return seen_false && seen_true;
}

bool IsWholeInteger(hid_t type) {
  return H5Tget_class(type) == H5T_INTEGER && PlainByteOrder(type) && H5Tget_offset(type) == 0 &&
         H5Tget_precision(type) == H5Tget_size(type) * 8;
}

// The dtype a reader without the lifeline_dtype attribute would give `type`.
std::optional<DType> InferDType(hid_t type) {
  switch (IeeeFloatSize(type)) {
    case 2: return DType::kF16;
    case 4: return DType::kF32;
    case 8: return DType::kF64;
    default: break;
  }
  if (IsBoolEnum(type)) return DType::kBool;
  if (!IsWholeInteger(type)) return std::nullopt;
  size_t size = H5Tget_size(type);
  if (H5Tget_sign(type) == H5T_SGN_2) {
    switch (size) {
      case 1: return DType::kI8;
      case 2: return DType::kI16;
      case 4: return DType::kI32;
      case 8: return DType::kI64;
      default: return std::nullopt;
    }
  }
  if (H5Tget_sign(type) == H5T_SGN_NONE && size == 1) return DType::kU8;
  return std::nullopt;
}

// Whether data stored as `type` can be read losslessly as `dtype`.
bool StoredTypeMatches(DType dtype, hid_t type) {
  if (IsRawBitsDType(dtype))
    return IsWholeInteger(type) && H5Tget_sign(type) == H5T_SGN_NONE && H5Tget_size(type) == DTypeSize(dtype);
  std::optional<DType> inferred = InferDType(type);
  return inferred.has_value() && *inferred == dtype;
}

std::string OrderText(hid_t type) {
  switch (H5Tget_order(type)) {
    case H5T_ORDER_LE: return "LE";
    case H5T_ORDER_BE: return "BE";
    default: return "mixed-endian";
  }
}

// The names of an enum's or compound's members, the first 8 of them, for messages.
std::string MemberNames(hid_t type) {
  std::string s;
  const int n = H5Tget_nmembers(type);
  for (int i = 0; i < n && i < 8; ++i) {
    char* name = H5Tget_member_name(type, static_cast<unsigned>(i));
    if (i > 0) s += ", ";
    s += name != nullptr ? name : "?";
    if (name != nullptr) H5free_memory(name);
  }
  if (n > 8) s += ", ...";
  return s;
}

std::string TypeText(hid_t type) {
  size_t size = H5Tget_size(type);
  std::string bytes = std::to_string(size) + " bytes";
  switch (H5Tget_class(type)) {
    case H5T_INTEGER: {
      std::string s = (H5Tget_sign(type) == H5T_SGN_2 ? "int" : "uint") + std::to_string(size * 8) + " " +
                      OrderText(type);
      if (!IsWholeInteger(type)) s += " (precision " + std::to_string(H5Tget_precision(type)) + ")";
      return s;
    }
    case H5T_FLOAT: {
      if (size_t ieee = IeeeFloatSize(type)) return "IEEE float" + std::to_string(ieee * 8) + " " + OrderText(type);
      size_t spos = 0, epos = 0, esize = 0, mpos = 0, msize = 0;
      H5Tget_fields(type, &spos, &epos, &esize, &mpos, &msize);
      return "float (" + bytes + ", " + std::to_string(esize) + " exponent bits, " + std::to_string(msize) +
             " mantissa bits, bias " + std::to_string(H5Tget_ebias(type)) + ")";
    }
    case H5T_ENUM: {
      Hid base = TypeHid(H5Tget_super(type));
      std::string s = "enum over " + (base.valid() ? TypeText(base.get()) : std::string("?")) + " {";
      s += MemberNames(type);
      return s + "}";
    }
    case H5T_STRING: {
      std::string cset = H5Tget_cset(type) == H5T_CSET_UTF8 ? "UTF-8" : "ASCII";
      if (H5Tis_variable_str(type) > 0) return "string (variable-length, " + cset + ")";
      return "string (fixed " + bytes + ", " + cset + ")";
    }
    case H5T_COMPOUND: {
      std::string s = "compound {";
      s += MemberNames(type);
      return s + "} (" + bytes + ")";
    }
    case H5T_TIME: return "time (" + bytes + ")";
    case H5T_BITFIELD: return "bitfield (" + bytes + ")";
    case H5T_OPAQUE: return "opaque (" + bytes + ")";
    case H5T_REFERENCE: return "reference";
    case H5T_VLEN: return "variable-length sequence";
    case H5T_ARRAY: return "array (" + bytes + ")";
    default: return "unknown type";
  }
}

// ---- string attributes ----

struct StringAttr {
  enum Kind { kMissing, kNotString, kString } kind = kMissing;
  std::string value;
  std::string type_text;  // for kNotString
};

// Reads attribute `key` of `obj` as one string. `fail` turns the current HDF5 error into a Status.
template <typename Fail>
Result<StringAttr> ReadStringAttr(hid_t obj, const std::string& key, const Fail& fail) {
  StringAttr out;
  htri_t exists = H5Aexists(obj, key.c_str());
  if (exists < 0) return fail("cannot look up attribute " + Quote(key));
  if (exists == 0) return out;
  Hid attr(H5Aopen(obj, key.c_str(), H5P_DEFAULT), H5Aclose);
  if (!attr.valid()) return fail("cannot open attribute " + Quote(key));
  Hid ftype = TypeHid(H5Aget_type(attr.get()));
  Hid space = SpaceHid(H5Aget_space(attr.get()));
  if (!ftype.valid() || !space.valid()) return fail("cannot read the type of attribute " + Quote(key));
  out.kind = StringAttr::kNotString;
  out.type_text = TypeText(ftype.get());
  if (H5Tget_class(ftype.get()) != H5T_STRING) return out;
  hssize_t npoints = H5Sget_simple_extent_npoints(space.get());
  if (npoints != 1) {
    out.type_text += " x " + std::to_string(npoints);
    return out;
  }
  if (H5Tis_variable_str(ftype.get()) > 0) {
    Hid mtype = TypeHid(H5Tcopy(H5T_C_S1));
    if (!mtype.valid() || H5Tset_size(mtype.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(mtype.get(), H5Tget_cset(ftype.get())) < 0)
      return fail("cannot build a string type");
    char* p = nullptr;
    if (H5Aread(attr.get(), mtype.get(), &p) < 0) return fail("cannot read attribute " + Quote(key));
    out.value = p != nullptr ? std::string(p) : std::string();
    H5Dvlen_reclaim(mtype.get(), space.get(), H5P_DEFAULT, &p);
  } else {
    size_t size = H5Tget_size(ftype.get());
    std::string buf(size, '\0');
    if (H5Aread(attr.get(), ftype.get(), buf.data()) < 0) return fail("cannot read attribute " + Quote(key));
    if (H5Tget_strpad(ftype.get()) == H5T_STR_SPACEPAD) {
      while (!buf.empty() && buf.back() == ' ') buf.pop_back();
    } else {
      buf.resize(std::strlen(buf.c_str()));
    }
    out.value = std::move(buf);
  }
  out.kind = StringAttr::kString;
  return out;
}

herr_t CollectAttributeName(hid_t, const char* name, const H5A_info_t*, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

herr_t CollectHardLink(hid_t, const char* name, const H5L_info_t* info, void* data) {
  if (info->type == H5L_TYPE_HARD) static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

// Chunk extents close to `chunk_bytes`: trailing dimensions kept whole while they fit.
std::vector<hsize_t> ChooseChunk(const std::vector<int64_t>& shape, size_t elem_size, uint64_t chunk_bytes) {
  uint64_t limit = std::min<uint64_t>(chunk_bytes, 0xFFFFFFFFull);  // HDF5: a chunk is < 4 GiB
  uint64_t budget = std::max<uint64_t>(1, limit / elem_size);
  std::vector<hsize_t> chunk(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 0;) {
    uint64_t c = std::min<uint64_t>(static_cast<uint64_t>(shape[i]), budget);
    chunk[i] = c;
    budget = std::max<uint64_t>(1, budget / c);
  }
  return chunk;
}

void DecomposeInto(const std::vector<int64_t>& shape, const std::vector<int64_t>& inner, size_t d,
                   std::vector<int64_t>* prefix, int64_t begin, int64_t end, std::vector<FlatRangeBox>* out) {
  if (begin >= end) return;
  const int64_t in = inner[d];
  auto emit = [&](int64_t row_begin, int64_t row_end) {
    FlatRangeBox box;
    box.start = *prefix;
    box.count.assign(prefix->size(), 1);
    box.start.push_back(row_begin);
    box.count.push_back(row_end - row_begin);
    for (size_t k = d + 1; k < shape.size(); ++k) {
      box.start.push_back(0);
      box.count.push_back(shape[k]);
    }
    out->push_back(std::move(box));
  };
  if (begin % in == 0 && end % in == 0) {
    emit(begin / in, end / in);
    return;
  }
  const int64_t first_row = begin / in, last_row = end / in;
  if (first_row == last_row) {  // inside one row of dimension d
    prefix->push_back(first_row);
    DecomposeInto(shape, inner, d + 1, prefix, begin - first_row * in, end - first_row * in, out);
    prefix->pop_back();
    return;
  }
  int64_t full_begin = first_row;
  if (begin % in != 0) {  // the tail of a partial first row
    prefix->push_back(first_row);
    DecomposeInto(shape, inner, d + 1, prefix, begin % in, in, out);
    prefix->pop_back();
    full_begin = first_row + 1;
  }
  if (full_begin < last_row) emit(full_begin, last_row);
  if (end % in != 0) {  // the head of a partial last row
    prefix->push_back(last_row);
    DecomposeInto(shape, inner, d + 1, prefix, 0, end % in, out);
    prefix->pop_back();
  }
}

}  // namespace

std::vector<FlatRangeBox> DecomposeFlatRange(const std::vector<int64_t>& box_shape, int64_t flat_begin,
                                             int64_t flat_end) {
  std::vector<FlatRangeBox> out;
  if (flat_begin >= flat_end) return out;
  if (box_shape.empty()) {
    out.push_back(FlatRangeBox{});
    return out;
  }
  std::vector<int64_t> inner(box_shape.size(), 1);
  for (size_t i = box_shape.size() - 1; i > 0; --i) inner[i - 1] = inner[i] * box_shape[i];
  if (inner[0] == 0) return out;  // a zero extent: the range must be empty anyway
  std::vector<int64_t> prefix;
  DecomposeInto(box_shape, inner, 0, &prefix, flat_begin, flat_end, &out);
  return out;
}

int64_t DatasetInfo::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// ---- Hdf5File ----

struct Hdf5File::Impl {
  struct OpenDataset {
    std::string name;
    Hid dataset;
    Hid mem_type;
    DatasetInfo info;
  };

  std::string path;
  Hid file;
  bool writable = false;
  // The dataset last used, kept open so its chunk cache survives between region calls.
  std::optional<OpenDataset> current;

  std::string Where(std::string_view kind, std::string_view name) const {
    return path + ", " + std::string(kind) + " " + Quote(name);
  }
  // A Status for an HDF5 call that just failed; reads the error stack, so call it first.
  Status Hdf5Error(StatusCode code, std::string_view where, std::string_view what) const {
    return Status(code, std::string(where) + ": " + std::string(what) + " (HDF5: " + InnermostHdf5Error() + ")");
  }

  Status CheckWritable() const {
    if (!file.valid()) return Status::FailedPrecondition(path, "HDF5 file is closed");
    if (!writable) return Status::FailedPrecondition(path, "HDF5 file is open read-only");
    return Status::OK();
  }
  Status CheckOpen() const {
    if (!file.valid()) return Status::FailedPrecondition(path, "HDF5 file is closed");
    return Status::OK();
  }

  Status DropCurrent() {
    if (!current.has_value()) return Status::OK();
    std::string name = current->name;
    current->mem_type.Reset();
    herr_t r = current->dataset.Close();
    if (r < 0) {
      Status s = Hdf5Error(StatusCode::kIOError, Where("dataset", name), "cannot flush and close");
      current.reset();
      return s;
    }
    current.reset();
    return Status::OK();
  }

  // Whether a link `name` (normalised, not "/") exists. InvalidArgument when a component before
  // the last is not a group.
  Result<bool> LinkExists(const std::string& name, std::string_view kind) {
    size_t pos = 0;
    while (true) {
      size_t next = name.find('/', pos);
      std::string prefix = name.substr(0, next);
      htri_t e = H5Lexists(file.get(), prefix.c_str(), H5P_DEFAULT);
      if (e < 0) return Hdf5Error(StatusCode::kIOError, Where(kind, name), "cannot look up " + Quote(prefix));
      if (e == 0) return false;
      // An external link opens another file of the machine: never followed.
      H5L_info_t link;
      if (H5Lget_info(file.get(), prefix.c_str(), &link, H5P_DEFAULT) < 0)
        return Hdf5Error(StatusCode::kIOError, Where(kind, name), "cannot look up " + Quote(prefix));
      if (link.type == H5L_TYPE_EXTERNAL)
        return Status::NotSupported(Where(kind, name), Quote(prefix) + " is an external link to another file; Lifeline "
                                                                        "reads only objects inside the HDF5 file it is given");
      if (next == std::string::npos) return true;
      Hid obj(H5Oopen(file.get(), prefix.c_str(), H5P_DEFAULT), H5Oclose);
      if (!obj.valid()) return false;  // e.g. a dangling soft link
      if (H5Iget_type(obj.get()) != H5I_GROUP)
        return Status::InvalidArgument(Where(kind, name), Quote(prefix) + " is not a group");
      pos = next + 1;
    }
  }

  // Opens the group or dataset at a normalised path ("/" = root).
  Result<Hid> OpenObject(const std::string& name, std::string_view kind) {
    if (name != "/") {
      LL_ASSIGN_OR_RETURN(bool exists, LinkExists(name, kind));
      if (!exists) return Status::NotFound(Where(kind, name), "does not exist");
    }
    Hid obj(H5Oopen(file.get(), name.c_str(), H5P_DEFAULT), H5Oclose);
    if (!obj.valid()) return Hdf5Error(StatusCode::kIOError, Where(kind, name), "cannot open");
    return obj;
  }

  // Raw data kept in external files, or gathered by a virtual dataset from other datasets and
  // files, would make a conversion read whatever files the HDF5 file names on this machine: only
  // data stored inside the file itself is read. Checked before anything reads the dataset.
  Status CheckDataInFile(hid_t dataset, const std::string& where) const {
    Hid dcpl = PlistHid(H5Dget_create_plist(dataset));
    if (!dcpl.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot read its creation properties");
    const int external = H5Pget_external_count(dcpl.get());
    if (external < 0) return Hdf5Error(StatusCode::kIOError, where, "cannot read its external storage list");
    if (external > 0) {
      char first[4096] = {};
      off_t offset = 0;
      hsize_t size = 0;
      H5Pget_external(dcpl.get(), 0, sizeof(first) - 1, first, &offset, &size);
      return Status::NotSupported(where, "keeps its data in " + std::to_string(external) + " external file(s), the first " +
                                             format::QuoteUntrusted(first) +
                                             "; Lifeline reads only data stored inside the HDF5 file it is given");
    }
    const H5D_layout_t layout = H5Pget_layout(dcpl.get());
    if (layout < 0) return Hdf5Error(StatusCode::kIOError, where, "cannot read its storage layout");
    if (layout == H5D_VIRTUAL)
      return Status::NotSupported(where, "is a virtual dataset (its data comes from other datasets or files); Lifeline "
                                         "reads only data stored inside the HDF5 file it is given");
    return Status::OK();
  }

  Result<DatasetInfo> DescribeOpen(hid_t dataset, const std::string& name) {
    const std::string where = Where("dataset", name);
    Hid type = TypeHid(H5Dget_type(dataset));
    Hid space = SpaceHid(H5Dget_space(dataset));
    if (!type.valid() || !space.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot read type and shape");
    DatasetInfo info;
    info.stored_type = TypeText(type.get());

    H5S_class_t space_class = H5Sget_simple_extent_type(space.get());
    if (space_class == H5S_SIMPLE) {
      int rank = H5Sget_simple_extent_ndims(space.get());
      if (rank < 0) return Hdf5Error(StatusCode::kIOError, where, "cannot read rank");
      if (static_cast<size_t>(rank) > kMaxRank)
        return Status::NotSupported(where, std::to_string(rank) + " dimensions (at most 32)");
      std::vector<hsize_t> dims(static_cast<size_t>(rank));
      if (rank > 0 && H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr) < 0)
        return Hdf5Error(StatusCode::kIOError, where, "cannot read extents");
      for (hsize_t d : dims) {
        if (d > static_cast<hsize_t>(std::numeric_limits<int64_t>::max()))
          return Status::NotSupported(where, "extent " + std::to_string(d) + " does not fit in int64");
        info.shape.push_back(static_cast<int64_t>(d));
      }
    } else if (space_class != H5S_SCALAR) {
      return Status::NotSupported(where, "null or unknown dataspace (no elements, no shape)");
    }

    LL_ASSIGN_OR_RETURN(
        StringAttr attr, ReadStringAttr(dataset, kHdf5DTypeAttribute, [&](const std::string& what) {
          return Hdf5Error(StatusCode::kIOError, where, what);
        }));
    if (attr.kind == StringAttr::kNotString) {
      return Status::Corruption(where, std::string("attribute ") + kHdf5DTypeAttribute + " is " + attr.type_text +
                                           ", not a string");
    } else if (attr.kind == StringAttr::kString) {
      std::optional<DType> dtype = ParseDType(attr.value);
      if (!dtype.has_value())
        return Status::Corruption(where, std::string(kHdf5DTypeAttribute) + " " + Quote(attr.value) +
                                             " is not a known dtype");
      if (!StoredTypeMatches(*dtype, type.get()))
        return Status::Corruption(where, std::string(kHdf5DTypeAttribute) + " " + Quote(attr.value) +
                                             " does not match the stored type " + info.stored_type);
      info.dtype = *dtype;
    } else {
      std::optional<DType> dtype = InferDType(type.get());
      if (!dtype.has_value())
        return Status::NotSupported(where, "stored type " + info.stored_type + " has no Lifeline dtype");
      info.dtype = *dtype;
    }

    int64_t bytes = static_cast<int64_t>(std::max(DTypeSize(info.dtype), H5Tget_size(type.get())));
    for (int64_t d : info.shape) {
      if (MulOverflows(bytes, d, &bytes))
        return Status::NotSupported(where, "shape " + JoinInts(info.shape) + " is too large (byte size overflows)");
    }
    return info;
  }

  // The open dataset `name` (normalised), reusing the current one.
  Result<OpenDataset*> Dataset(const std::string& name) {
    LL_RETURN_IF_ERROR(CheckOpen());
    if (current.has_value() && current->name == name) return &*current;
    LL_RETURN_IF_ERROR(DropCurrent());
    const std::string where = Where("dataset", name);
    LL_ASSIGN_OR_RETURN(Hid obj, OpenObject(name, "dataset"));
    if (H5Iget_type(obj.get()) != H5I_DATASET) return Status::InvalidArgument(where, "is a group, not a dataset");
    obj.Reset();
    Hid dapl = PlistHid(H5Pcreate(H5P_DATASET_ACCESS));
    if (!dapl.valid() || H5Pset_chunk_cache(dapl.get(), kChunkCacheSlots, kChunkCacheBytes, 1.0) < 0)
      return Hdf5Error(StatusCode::kIOError, where, "cannot set up dataset access");
    Hid dataset(H5Dopen2(file.get(), name.c_str(), dapl.get()), H5Dclose);
    if (!dataset.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot open");
    LL_RETURN_IF_ERROR(CheckDataInFile(dataset.get(), where));
    LL_ASSIGN_OR_RETURN(DatasetInfo info, DescribeOpen(dataset.get(), name));
    Hid mem_type = TypeFor(info.dtype);
    if (!mem_type.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot build the memory type");
    current.emplace(OpenDataset{name, std::move(dataset), std::move(mem_type), std::move(info)});
    return &*current;
  }

  Status Transfer(bool write, const std::string& path_arg, const std::vector<int64_t>& offsets,
                  const std::vector<int64_t>& box, int64_t flat_begin, int64_t flat_end, void* buf) {
    if (write) LL_RETURN_IF_ERROR(CheckWritable());
    LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(path, path_arg, false));
    LL_ASSIGN_OR_RETURN(OpenDataset * ds, Dataset(name));
    const std::vector<int64_t>& dims = ds->info.shape;
    const std::string where = Where("dataset", name);
    auto bad_region = [&](std::string_view why) {
      return Status::InvalidArgument(where, "region offsets " + JoinInts(offsets) + " shape " + JoinInts(box) +
                                                " range [" + std::to_string(flat_begin) + ", " +
                                                std::to_string(flat_end) + ") of dataset shape " + JoinInts(dims) +
                                                ": " + std::string(why));
    };
    if (offsets.size() != dims.size() || box.size() != dims.size()) return bad_region("rank mismatch");
    int64_t box_elements = 1;
    for (size_t i = 0; i < dims.size(); ++i) {
      if (offsets[i] < 0 || box[i] < 0) return bad_region("negative offset or extent");
      if (offsets[i] > dims[i] || box[i] > dims[i] - offsets[i]) return bad_region("box outside the dataset");
      if (MulOverflows(box_elements, box[i], &box_elements)) return bad_region("box too large");
    }
    if (flat_begin < 0 || flat_begin > flat_end || flat_end > box_elements)
      return bad_region("range outside the box");
    if (flat_begin == flat_end) return Status::OK();

    const size_t elem = DTypeSize(ds->info.dtype);
    auto* bytes = static_cast<unsigned char*>(buf);
    if (write && ds->info.dtype == DType::kBool) {
      size_t n = static_cast<size_t>(flat_end - flat_begin);
      for (size_t i = 0; i < n; ++i) {
        if (bytes[i] > 1)
          return Status::InvalidArgument(where, "bool element " + std::to_string(flat_begin + static_cast<int64_t>(i)) +
                                                    " of the range is " + std::to_string(bytes[i]) + ", not 0 or 1");
      }
    }
    auto io = [&](hid_t mem_space, hid_t file_space, unsigned char* p) {
      return write ? H5Dwrite(ds->dataset.get(), ds->mem_type.get(), mem_space, file_space, H5P_DEFAULT, p)
                   : H5Dread(ds->dataset.get(), ds->mem_type.get(), mem_space, file_space, H5P_DEFAULT, p);
    };
    const char* verb = write ? "cannot write" : "cannot read";

    if (dims.empty()) {
      if (io(H5S_ALL, H5S_ALL, bytes) < 0) return Hdf5Error(StatusCode::kIOError, where, verb);
    } else {
      Hid file_space = SpaceHid(H5Dget_space(ds->dataset.get()));
      if (!file_space.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot get the dataspace");
      std::vector<hsize_t> start(dims.size()), count(dims.size());
      int64_t done = 0;
      for (const FlatRangeBox& part : DecomposeFlatRange(box, flat_begin, flat_end)) {
        hsize_t n = 1;
        for (size_t i = 0; i < dims.size(); ++i) {
          start[i] = static_cast<hsize_t>(offsets[i] + part.start[i]);
          count[i] = static_cast<hsize_t>(part.count[i]);
          n *= count[i];
        }
        if (H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr) < 0)
          return Hdf5Error(StatusCode::kIOError, where, "cannot select a hyperslab");
        // A memory space of the box's own shape lets HDF5 map whole rows to chunks; a 1-D one makes
        // it iterate element by element (several times slower).
        Hid mem_space = SpaceHid(H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr));
        if (!mem_space.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot create a memory dataspace");
        if (io(mem_space.get(), file_space.get(), bytes + static_cast<size_t>(done) * elem) < 0)
          return Hdf5Error(StatusCode::kIOError, where,
                           std::string(verb) + " hyperslab at " +
                               JoinInts(std::vector<int64_t>(start.begin(), start.end())) + " of extent " +
                               JoinInts(std::vector<int64_t>(count.begin(), count.end())));
        done += static_cast<int64_t>(n);
      }
    }
    if (!write && ds->info.dtype == DType::kBool) {
      size_t n = static_cast<size_t>(flat_end - flat_begin);
      for (size_t i = 0; i < n; ++i) bytes[i] = bytes[i] != 0 ? 1 : 0;
    }
    return Status::OK();
  }

  Status WriteStringAttr(hid_t obj, const std::string& where, const std::string& key, const std::string& value) {
    htri_t exists = H5Aexists(obj, key.c_str());
    if (exists < 0) return Hdf5Error(StatusCode::kIOError, where, "cannot look up attribute " + Quote(key));
    if (exists > 0 && H5Adelete(obj, key.c_str()) < 0)
      return Hdf5Error(StatusCode::kIOError, where, "cannot replace attribute " + Quote(key));
    Hid type = TypeHid(H5Tcopy(H5T_C_S1));
    Hid space = SpaceHid(H5Screate(H5S_SCALAR));
    Hid acpl = PlistHid(H5Pcreate(H5P_ATTRIBUTE_CREATE));
    if (!type.valid() || !space.valid() || !acpl.valid() || H5Tset_size(type.get(), H5T_VARIABLE) < 0 ||
        H5Tset_cset(type.get(), H5T_CSET_UTF8) < 0 || H5Pset_char_encoding(acpl.get(), H5T_CSET_UTF8) < 0)
      return Hdf5Error(StatusCode::kIOError, where, "cannot build a string attribute type");
    Hid attr(H5Acreate2(obj, key.c_str(), type.get(), space.get(), acpl.get(), H5P_DEFAULT), H5Aclose);
    if (!attr.valid()) return Hdf5Error(StatusCode::kIOError, where, "cannot create attribute " + Quote(key));
    const char* p = value.c_str();
    if (H5Awrite(attr.get(), type.get(), &p) < 0)
      return Hdf5Error(StatusCode::kIOError, where, "cannot write attribute " + Quote(key));
    if (attr.Close() < 0) return Hdf5Error(StatusCode::kIOError, where, "cannot close attribute " + Quote(key));
    return Status::OK();
  }
};

Hdf5File::Hdf5File(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Hdf5File::Hdf5File(Hdf5File&&) noexcept = default;
Hdf5File& Hdf5File::operator=(Hdf5File&& o) noexcept {
  if (this != &o) {
    if (impl_ != nullptr) Close().IgnoreError();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
Hdf5File::~Hdf5File() {
  if (impl_ != nullptr) Close().IgnoreError();
}

const std::string& Hdf5File::path() const {
  static const std::string kEmpty;
  return impl_ != nullptr ? impl_->path : kEmpty;
}

namespace {

Hid MakeFileAccess() {
  Hid fapl = PlistHid(H5Pcreate(H5P_FILE_ACCESS));
  // Closing the file closes everything opened through it, so no handle can keep it open.
  if (fapl.valid() && H5Pset_fclose_degree(fapl.get(), H5F_CLOSE_STRONG) < 0) return Hid();
  return fapl;
}

}  // namespace

Result<Hdf5File> Hdf5File::Create(const std::string& path) {
  DisableErrorPrinting();
  if (path.empty() || path.find('\0') != std::string::npos)
    return Status::InvalidArgument("HDF5 file path " + Quote(path), "empty or contains a NUL byte");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  impl->writable = true;
  Hid fapl = MakeFileAccess();
  if (!fapl.valid()) return impl->Hdf5Error(StatusCode::kIOError, path, "cannot set up file access");
  impl->file = Hid(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  if (!impl->file.valid()) return impl->Hdf5Error(StatusCode::kIOError, path, "cannot create HDF5 file");
  return Hdf5File(std::move(impl));
}

Result<Hdf5File> Hdf5File::OpenReadOnly(const std::string& path) {
  DisableErrorPrinting();
  if (path.empty() || path.find('\0') != std::string::npos)
    return Status::InvalidArgument("HDF5 file path " + Quote(path), "empty or contains a NUL byte");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, path);
  if (S_ISDIR(st.st_mode)) return Status::InvalidArgument(path, "is a directory, not an HDF5 file");
  auto impl = std::make_unique<Impl>();
  impl->path = path;
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 < 0) return impl->Hdf5Error(StatusCode::kIOError, path, "cannot read HDF5 file");
  if (is_hdf5 == 0) return Status::Corruption(path, "not an HDF5 file (no HDF5 signature)");
  Hid fapl = MakeFileAccess();
  if (!fapl.valid()) return impl->Hdf5Error(StatusCode::kIOError, path, "cannot set up file access");
  impl->file = Hid(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  if (!impl->file.valid())
    return impl->Hdf5Error(StatusCode::kCorruption, path, "cannot open HDF5 file: truncated or damaged");
  return Hdf5File(std::move(impl));
}

Status Hdf5File::Close() {
  if (impl_ == nullptr || !impl_->file.valid()) return Status::OK();
  Status dataset_status = impl_->DropCurrent();
  herr_t r = impl_->file.Close();
  if (r < 0) return impl_->Hdf5Error(StatusCode::kIOError, impl_->path, "cannot flush and close HDF5 file");
  return dataset_status;
}

Status Hdf5File::CreateDataset(const std::string& path_arg, DType dtype, const std::vector<int64_t>& shape,
                               const DatasetOptions& opts) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  Impl& im = *impl_;
  LL_RETURN_IF_ERROR(im.CheckWritable());
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(im.path, path_arg, false));
  const std::string where = im.Where("dataset", name);
  const size_t elem = DTypeSize(dtype);
  if (elem == 0) return Status::InvalidArgument(where, "invalid dtype code " + std::to_string(static_cast<int>(dtype)));
  if (shape.size() > kMaxRank) return Status::InvalidArgument(where, "more than 32 dimensions");
  int64_t elements = 1, bytes = static_cast<int64_t>(elem);
  for (int64_t d : shape) {
    if (d < 0) return Status::InvalidArgument(where, "negative extent in shape " + JoinInts(shape));
    if (MulOverflows(elements, d, &elements) || MulOverflows(bytes, d, &bytes))
      return Status::InvalidArgument(where, "shape " + JoinInts(shape) + " is too large (byte size overflows)");
  }
  if (opts.chunk_bytes == 0) return Status::InvalidArgument(where, "chunk_bytes must be positive");
  if (opts.deflate_level < 0 || opts.deflate_level > 9)
    return Status::InvalidArgument(where, "deflate level " + std::to_string(opts.deflate_level) + " is not 0..9");
  LL_ASSIGN_OR_RETURN(bool exists, im.LinkExists(name, "dataset"));
  if (exists) return Status::AlreadyExists(where, "already exists");

  Hid type = TypeFor(dtype);
  if (!type.valid()) return im.Hdf5Error(StatusCode::kIOError, where, "cannot build the element type");
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  Hid space = SpaceHid(shape.empty() ? H5Screate(H5S_SCALAR)
                                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr));
  Hid dcpl = PlistHid(H5Pcreate(H5P_DATASET_CREATE));
  Hid lcpl = PlistHid(H5Pcreate(H5P_LINK_CREATE));
  Hid dapl = PlistHid(H5Pcreate(H5P_DATASET_ACCESS));
  if (!space.valid() || !dcpl.valid() || !lcpl.valid() || !dapl.valid() ||
      H5Pset_obj_track_times(dcpl.get(), 0) < 0 ||  // identical inputs give identical files
      H5Pset_create_intermediate_group(lcpl.get(), 1) < 0 || H5Pset_char_encoding(lcpl.get(), H5T_CSET_UTF8) < 0 ||
      H5Pset_chunk_cache(dapl.get(), kChunkCacheSlots, kChunkCacheBytes, 1.0) < 0)
    return im.Hdf5Error(StatusCode::kIOError, where, "cannot set up dataset creation");
  herr_t layout_ok = 0;
  if (shape.empty()) {
    layout_ok = H5Pset_layout(dcpl.get(), H5D_COMPACT);
  } else if (elements == 0) {
    layout_ok = H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS);  // HDF5 cannot chunk a zero extent
  } else {
    std::vector<hsize_t> chunk = ChooseChunk(shape, elem, opts.chunk_bytes);
    layout_ok = H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data());
    if (layout_ok >= 0 && opts.deflate_level > 0) {
      if (H5Zfilter_avail(H5Z_FILTER_DEFLATE) <= 0)
        return Status::NotSupported(where, "this HDF5 library has no deflate filter");
      if (elem > 1) layout_ok = H5Pset_shuffle(dcpl.get());
      if (layout_ok >= 0) layout_ok = H5Pset_deflate(dcpl.get(), static_cast<unsigned>(opts.deflate_level));
    }
  }
  if (layout_ok < 0) return im.Hdf5Error(StatusCode::kIOError, where, "cannot set the dataset layout");

  LL_RETURN_IF_ERROR(im.DropCurrent());
  Hid dataset(H5Dcreate2(im.file.get(), name.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), dapl.get()),
              H5Dclose);
  if (!dataset.valid()) return im.Hdf5Error(StatusCode::kIOError, where, "cannot create dataset");
  LL_RETURN_IF_ERROR(im.WriteStringAttr(dataset.get(), where, kHdf5DTypeAttribute, std::string(DTypeName(dtype))));
  DatasetInfo info;
  info.dtype = dtype;
  info.shape = shape;
  info.stored_type = TypeText(type.get());
  im.current.emplace(Impl::OpenDataset{name, std::move(dataset), std::move(type), std::move(info)});
  return Status::OK();
}

Status Hdf5File::WriteRegion(const std::string& path, const std::vector<int64_t>& box_offsets,
                             const std::vector<int64_t>& box_shape, int64_t flat_begin, int64_t flat_end,
                             const void* data) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  // Transfer only reads through the pointer when writing.
  return impl_->Transfer(true, path, box_offsets, box_shape, flat_begin, flat_end, const_cast<void*>(data));
}

Status Hdf5File::ReadRegion(const std::string& path, const std::vector<int64_t>& box_offsets,
                            const std::vector<int64_t>& box_shape, int64_t flat_begin, int64_t flat_end, void* out) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  return impl_->Transfer(false, path, box_offsets, box_shape, flat_begin, flat_end, out);
}

namespace {

Status CheckWholeSize(const std::string& where, const DatasetInfo& info, size_t bytes) {
  uint64_t want = static_cast<uint64_t>(info.num_elements()) * DTypeSize(info.dtype);
  if (want != bytes)
    return Status::InvalidArgument(where, "buffer of " + std::to_string(bytes) + " bytes for a dataset of " +
                                              std::to_string(want) + " bytes");
  return Status::OK();
}

}  // namespace

Status Hdf5File::WriteAll(const std::string& path, const void* data, size_t bytes) {
  LL_ASSIGN_OR_RETURN(DatasetInfo info, Describe(path));
  LL_RETURN_IF_ERROR(CheckWholeSize(impl_->Where("dataset", path), info, bytes));
  return WriteRegion(path, std::vector<int64_t>(info.shape.size(), 0), info.shape, 0, info.num_elements(), data);
}

Status Hdf5File::ReadAll(const std::string& path, void* out, size_t bytes) {
  LL_ASSIGN_OR_RETURN(DatasetInfo info, Describe(path));
  LL_RETURN_IF_ERROR(CheckWholeSize(impl_->Where("dataset", path), info, bytes));
  return ReadRegion(path, std::vector<int64_t>(info.shape.size(), 0), info.shape, 0, info.num_elements(), out);
}

Result<DatasetInfo> Hdf5File::Describe(const std::string& path) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(impl_->path, path, false));
  LL_ASSIGN_OR_RETURN(Impl::OpenDataset * ds, impl_->Dataset(name));
  return ds->info;
}

Result<std::vector<std::string>> Hdf5File::ListDatasets(const std::string& group) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  Impl& im = *impl_;
  LL_RETURN_IF_ERROR(im.CheckOpen());
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(im.path, group, true));
  const std::string where = im.Where("group", name);
  LL_ASSIGN_OR_RETURN(Hid obj, im.OpenObject(name, "group"));
  if (H5Iget_type(obj.get()) != H5I_GROUP) return Status::InvalidArgument(where, "is not a group");
  std::vector<std::string> links;
  if (H5Lvisit(obj.get(), H5_INDEX_NAME, H5_ITER_INC, CollectHardLink, &links) < 0)
    return im.Hdf5Error(StatusCode::kIOError, where, "cannot list links");
  std::vector<std::string> out;
  const std::string prefix = name == "/" ? std::string() : name + "/";
  for (const std::string& link : links) {
    Hid child(H5Oopen(obj.get(), link.c_str(), H5P_DEFAULT), H5Oclose);
    if (!child.valid()) return im.Hdf5Error(StatusCode::kIOError, where, "cannot open " + Quote(link));
    if (H5Iget_type(child.get()) == H5I_DATASET) out.push_back(prefix + link);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status Hdf5File::SetStringAttribute(const std::string& object_path, const std::string& key, const std::string& value) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  Impl& im = *impl_;
  LL_RETURN_IF_ERROR(im.CheckWritable());
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(im.path, object_path, true));
  const std::string where = im.Where("object", name);
  if (key.empty() || key.find('\0') != std::string::npos)
    return Status::InvalidArgument(where, "attribute name " + Quote(key) + " is empty or contains a NUL byte");
  if (value.find('\0') != std::string::npos)
    return Status::InvalidArgument(where, "value of attribute " + Quote(key) + " contains a NUL byte");
  // The dataset just created or written takes the attribute through its open handle (closing and
  // reopening it per attribute is most of the cost of exporting many small tensors), unless the
  // attribute is one its cached description depends on (lifeline_dtype).
  if (im.current.has_value() && im.current->name == name && key != kHdf5DTypeAttribute)
    return im.WriteStringAttr(im.current->dataset.get(), where, key, value);
  LL_RETURN_IF_ERROR(im.DropCurrent());
  LL_ASSIGN_OR_RETURN(Hid obj, im.OpenObject(name, "object"));
  return im.WriteStringAttr(obj.get(), where, key, value);
}

Result<std::optional<std::string>> Hdf5File::GetStringAttribute(const std::string& object_path,
                                                                const std::string& key) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  Impl& im = *impl_;
  LL_RETURN_IF_ERROR(im.CheckOpen());
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(im.path, object_path, true));
  const std::string where = im.Where("object", name);
  if (key.empty() || key.find('\0') != std::string::npos)
    return Status::InvalidArgument(where, "attribute name " + Quote(key) + " is empty or contains a NUL byte");
  LL_ASSIGN_OR_RETURN(Hid obj, im.OpenObject(name, "object"));
  LL_ASSIGN_OR_RETURN(StringAttr attr, ReadStringAttr(obj.get(), key, [&](const std::string& what) {
                        return im.Hdf5Error(StatusCode::kIOError, where, what);
                      }));
  switch (attr.kind) {
    case StringAttr::kMissing: return std::optional<std::string>();
    case StringAttr::kNotString:
      return Status::InvalidArgument(where, "attribute " + Quote(key) + " is " + attr.type_text + ", not a string");
    case StringAttr::kString: break;
  }
  return std::optional<std::string>(std::move(attr.value));
}

Result<std::vector<std::pair<std::string, std::string>>> Hdf5File::StringAttributes(const std::string& object_path) {
  if (impl_ == nullptr) return Status::FailedPrecondition("Hdf5File used after move");
  Impl& im = *impl_;
  LL_RETURN_IF_ERROR(im.CheckOpen());
  LL_ASSIGN_OR_RETURN(std::string name, NormalizePath(im.path, object_path, true));
  const std::string where = im.Where("object", name);
  LL_ASSIGN_OR_RETURN(Hid obj, im.OpenObject(name, "object"));
  std::vector<std::string> keys;
  hsize_t idx = 0;
  if (H5Aiterate2(obj.get(), H5_INDEX_NAME, H5_ITER_INC, &idx, CollectAttributeName, &keys) < 0)
    return im.Hdf5Error(StatusCode::kIOError, where, "cannot list attributes");
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& key : keys) {
    LL_ASSIGN_OR_RETURN(StringAttr attr, ReadStringAttr(obj.get(), key, [&](const std::string& what) {
                          return im.Hdf5Error(StatusCode::kIOError, where, what);
                        }));
    if (attr.kind == StringAttr::kString) out.emplace_back(key, std::move(attr.value));
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status Hdf5File::WriteBytes(const std::string& path, std::string_view bytes) {
  if (bytes.size() > static_cast<size_t>(std::numeric_limits<int64_t>::max()))
    return Status::InvalidArgument(path, "byte string too large");
  LL_RETURN_IF_ERROR(CreateDataset(path, DType::kU8, {static_cast<int64_t>(bytes.size())}, DatasetOptions{}));
  return WriteAll(path, bytes.data(), bytes.size());
}

Result<std::string> Hdf5File::ReadBytes(const std::string& path) {
  LL_ASSIGN_OR_RETURN(DatasetInfo info, Describe(path));
  if (info.dtype != DType::kU8 || info.shape.size() != 1)
    return Status::InvalidArgument(impl_->Where("dataset", path), "holds " + std::string(DTypeName(info.dtype)) +
                                                                      " of shape " + JoinInts(info.shape) +
                                                                      ", not a 1-D u8 byte string");
  // The extent comes from the file: a few damaged bytes can claim a terabyte (found by
  // tests/fuzz/hdf5_read_fuzz). A byte string is written whole, so it cannot be longer than what
  // the file stores for it, times deflate's largest ratio (1032:1) should another writer have
  // compressed it; and what still cannot be allocated is refused, not thrown.
  const uint64_t stored = impl_->current.has_value() ? H5Dget_storage_size(impl_->current->dataset.get()) : 0;
  if (static_cast<uint64_t>(info.shape[0]) / 1032 > stored)
    return Status::Corruption(impl_->Where("dataset", path), "byte string of " + std::to_string(info.shape[0]) +
                                                                 " bytes, but only " + std::to_string(stored) +
                                                                 " bytes stored for it");
  std::string out;
  try {
    out.resize(static_cast<size_t>(info.shape[0]));
  } catch (const std::exception&) {
    return Status::ResourceExhausted(impl_->Where("dataset", path),
                                     "cannot allocate " + std::to_string(info.shape[0]) + " bytes for the byte string");
  }
  LL_RETURN_IF_ERROR(ReadAll(path, out.data(), out.size()));
  return out;
}

}  // namespace lifeline

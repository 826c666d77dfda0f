#include "tools/lifeline/byte_size.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace lifeline::cli {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

Result<uint64_t> ParseByteSize(std::string_view text) {
  auto invalid = [&text](std::string_view why) {
    return Status::InvalidArgument("invalid size \"" + std::string(text) + "\"", why);
  };
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string_view number = text.substr(0, i);
  if (number.empty()) return invalid("expected a number followed by an optional unit such as MiB or G");
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  const std::string u = Lower(unit);
  int shift = 0;
  if (u.empty() || u == "b") {
    shift = 0;
  } else if (u == "k" || u == "kib" || u == "kb") {
    shift = 10;
  } else if (u == "m" || u == "mib" || u == "mb") {
    shift = 20;
  } else if (u == "g" || u == "gib" || u == "gb") {
    shift = 30;
  } else if (u == "t" || u == "tib" || u == "tb") {
    shift = 40;
  } else {
    return invalid("unknown unit \"" + std::string(unit) + "\" (use B, KiB, MiB, GiB, TiB or K, M, G, T)");
  }
  if (number.find('.') == std::string_view::npos) {
    uint64_t v = 0;
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
    if (ec != std::errc() || end != number.data() + number.size()) return invalid("not a whole number");
    if (shift > 0 && v > (UINT64_MAX >> shift)) return invalid("too large");
    return v << shift;
  }
  double v = 0;
  auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), v);
  if (ec != std::errc() || end != number.data() + number.size()) return invalid("not a number");
  const double bytes = std::ldexp(v, shift);
  if (!(bytes < 18446744073709551616.0)) return invalid("too large");
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 5) {
    v /= 1024;
    ++unit;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, kUnits[unit]);
  return buf;
}

}  // namespace lifeline::cli

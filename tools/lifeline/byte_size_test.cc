#include "tools/lifeline/byte_size.h"

#include <gtest/gtest.h>

namespace lifeline::cli {
namespace byte_size_test {

TEST(ByteSizeTest, ParsesUnits) {
  EXPECT_EQ(*ParseByteSize("4096"), 4096u);
  EXPECT_EQ(*ParseByteSize("12B"), 12u);
  EXPECT_EQ(*ParseByteSize("2GiB"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("2G"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("256MiB"), 256ull << 20);
  EXPECT_EQ(*ParseByteSize("256 mib"), 256ull << 20);
  EXPECT_EQ(*ParseByteSize("64K"), 64ull << 10);
  EXPECT_EQ(*ParseByteSize("1.5GiB"), 3ull << 29);
  EXPECT_EQ(*ParseByteSize("1TiB"), 1ull << 40);
}

TEST(ByteSizeTest, RejectsNonsenseAndNamesIt) {
  for (const char* bad : {"", "GiB", "12XB", "-1", "1.2.3M", "99999999999999999999", "20000000T"}) {
    auto r = ParseByteSize(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(std::string("\"") + bad + "\""), std::string::npos) << r.status().ToString();
  }
}

TEST(ByteSizeTest, Formats) {
  EXPECT_EQ(FormatByteSize(512), "512 B");
  EXPECT_EQ(FormatByteSize(256ull << 20), "256.00 MiB");
  EXPECT_EQ(FormatByteSize(3ull << 29), "1.50 GiB");
}

}  // namespace byte_size_test
}  // namespace lifeline::cli

#include "tools/lifeline/metadata_text.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace lifeline::cli {
namespace {

using Lines = std::vector<std::string>;

TEST(MetadataLinesTest, EachKeyOnItsLineShortValuesWholeInTheObjectsOrder) {
  EXPECT_EQ(MetadataLines(""), Lines{"(none)"});
  EXPECT_EQ(MetadataLines("{}"), Lines{"{}"});
  EXPECT_EQ(MetadataLines(R"({"step": 5, "model": "lifeline-synthetic", "tp": [2, 1]})"),
            (Lines{"step: 5", "model: \"lifeline-synthetic\"", "tp: [2,1]"}));
}

TEST(MetadataLinesTest, LongValuesAreDescribedNotPrinted) {
  // As DCP's planner data: thousands of entries on one line before.
  std::string planner = "{";
  for (int i = 0; i < 2000; ++i) planner += (i ? "," : "") + std::string("\"model.layers.") + std::to_string(i) + "\":[\"model\"]";
  planner += "}";
  std::string steps = "[";
  for (int i = 0; i < 50; ++i) steps += (i ? "," : "") + std::to_string(i);
  steps += "]";  // 140 bytes
  const std::string text = R"({"dcp_planner_data": )" + planner + R"(, "steps": )" + steps + R"(, "note": ")" +
                           std::string(300, 'x') + R"(", "step": 40})";
  const Lines lines = MetadataLines(text, 100);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0], "dcp_planner_data: {2000 keys, " + std::to_string(planner.size()) + " bytes}");
  EXPECT_EQ(lines[1], "steps: [50 items, " + std::to_string(steps.size()) + " bytes]");
  EXPECT_EQ(lines[2], "note: \"" + std::string(99, 'x') + "... (302 characters)");
  EXPECT_EQ(lines[3], "step: 40");
  for (const std::string& line : lines) EXPECT_LE(line.size(), 140u) << line;
}

TEST(MetadataLinesTest, TextThatIsNotAJsonObjectIsOneLineCutToTheLimit) {
  EXPECT_EQ(MetadataLines("not json at all"), Lines{"not json at all"});
  EXPECT_EQ(MetadataLines("[1,2,3]"), Lines{"[1,2,3]"});
  EXPECT_EQ(MetadataLines(std::string(150, 'a'), 100), Lines{std::string(100, 'a') + "... (150 characters)"});
}

}  // namespace
}  // namespace lifeline::cli

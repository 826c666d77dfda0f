// The rename rules and export planning of lifeline/convert.h (ParseRenameRule, ParseRenameRules,
// PlanExportTensors) and MappedTensorSource: training names to Hugging Face's, collisions and
// empty names refused naming the tensors, --select on the source's names, casts read in pieces.
#include "lib/src/convert/tensor_mapping.h"

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lib/src/convert/dtype_cast.h"
#include "lib/src/convert/test_sources.h"
#include "lifeline/convert.h"
#include "lifeline/env.h"
#include "tests/kit/test_kit.h"

namespace lifeline::test {
namespace tensor_mapping_test {

// torchtitan's Llama names to Hugging Face's LlamaForCausalLM, as a user would write them.
constexpr char kLlamaRules[] = R"(# torchtitan -> Hugging Face
tok_embeddings\.weight=model.embed_tokens.weight
  layers\.(\d+)\.attention\.wq\.weight = model.layers.$1.self_attn.q_proj.weight
layers\.(\d+)\.attention\.wk\.weight=model.layers.$1.self_attn.k_proj.weight
layers\.(\d+)\.attention_norm\.weight=model.layers.$1.input_layernorm.weight

norm\.weight=model.norm.weight
output\.weight=lm_head.weight
)";

std::vector<std::string> Names(const std::vector<ExportTensor>& plan) {
  std::vector<std::string> out;
  for (const ExportTensor& e : plan) out.push_back(e.name);
  return out;
}

class TensorMappingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TestTensor step{"step", DType::kI64, {}, std::string(8, '\0')};
    WriteSafetensors(mem_.get(), "/in/model.safetensors",
                     {F32Tensor("tok_embeddings.weight", {4, 2}, 0), F32Tensor("layers.0.attention.wq.weight", {2, 2}, 10),
                      F32Tensor("layers.0.attention_norm.weight", {2}, 20), F32Tensor("layers.1.attention.wk.weight", {2, 2}, 30),
                      F32Tensor("norm.weight", {2}, 40), F32Tensor("output.weight", {4, 2}, 50),
                      F32Tensor("optim.layers.0.attention.wq.weight", {2, 2}, 60), step});
    SourceOptions o;
    o.env = mem_.get();
    Result<std::unique_ptr<TensorSource>> opened = OpenTensorSource("/in/model.safetensors", o);
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    source_ = std::move(opened).value();
  }

  ConvertOptions WithRules(std::string_view rules_text) {
    ConvertOptions o;
    Result<std::vector<RenameRule>> rules = ParseRenameRules(rules_text, "rules.txt");
    EXPECT_TRUE(rules.ok()) << rules.status().ToString();
    if (rules.ok()) o.rename = *rules;
    return o;
  }

  std::unique_ptr<MemEnv> mem_ = NewMemEnv();
  std::unique_ptr<TensorSource> source_;
};

TEST(RenameRuleTest, ParsesPatternAndReplacement) {
  Result<RenameRule> r = ParseRenameRule("a\\.(\\d+)=b.$1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ("a\\.(\\d+)", r->pattern);
  EXPECT_EQ("b.$1", r->replacement);
  // The first '=' splits; the replacement may hold more.
  r = ParseRenameRule("a=b=c");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ("a", r->pattern);
  EXPECT_EQ("b=c", r->replacement);
  // An escaped '=' belongs to the pattern (and std::regex reads \= as '=').
  r = ParseRenameRule("x\\=1=y");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ("x\\=1", r->pattern);
  EXPECT_EQ("y", r->replacement);
  // An empty replacement parses (PlanExportTensors refuses the empty name it makes).
  EXPECT_TRUE(ParseRenameRule("x=").ok());

  for (const char* bad : {"no rule here", "=x", "(unclosed=x", "a[=b"}) {
    Result<RenameRule> e = ParseRenameRule(bad);
    EXPECT_EQ(StatusCode::kInvalidArgument, e.status().code()) << bad;
    EXPECT_TRUE(StatusMentions(e.status(), bad)) << e.status().ToString();
  }
}

TEST(RenameRuleTest, AFileSkipsCommentsAndBlankLinesAndNamesTheBadLine) {
  Result<std::vector<RenameRule>> rules = ParseRenameRules(kLlamaRules, "rules.txt");
  ASSERT_TRUE(rules.ok()) << rules.status().ToString();
  ASSERT_EQ(6u, rules->size());
  // Spaces around the whole line are trimmed, not those around the '='.
  EXPECT_EQ("layers\\.(\\d+)\\.attention\\.wq\\.weight ", (*rules)[1].pattern);
  EXPECT_EQ(" model.layers.$1.self_attn.q_proj.weight", (*rules)[1].replacement);
  rules = ParseRenameRules("a=b\r\n\n  # x\nbroken\n", "r.txt");
  EXPECT_EQ(StatusCode::kInvalidArgument, rules.status().code());
  EXPECT_TRUE(StatusMentions(rules.status(), "r.txt:4")) << rules.status().ToString();
  EXPECT_TRUE(ParseRenameRules("", "empty").value_or(std::vector<RenameRule>{{"x", "y"}}).empty());
}

TEST_F(TensorMappingTest, TrainingNamesBecomeHuggingFaceNames) {
  ConvertOptions o;
  for (const char* text : {"tok_embeddings\\.weight=model.embed_tokens.weight",
                           "layers\\.(\\d+)\\.attention\\.wq\\.weight=model.layers.$1.self_attn.q_proj.weight",
                           "layers\\.(\\d+)\\.attention\\.wk\\.weight=model.layers.$1.self_attn.k_proj.weight",
                           "layers\\.(\\d+)\\.attention_norm\\.weight=model.layers.$1.input_layernorm.weight",
                           "norm\\.weight=model.norm.weight", "output\\.weight=lm_head.weight"})
    o.rename.push_back(ParseRenameRule(text).value());
  o.select = {"tok_embeddings.", "layers.", "norm.", "output.", "step"};  // the source's names
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(*source_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ((std::vector<std::string>{"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.input_layernorm.weight", "model.layers.1.self_attn.k_proj.weight",
                                      "model.norm.weight", "lm_head.weight", "step"}),
            Names(*plan));
  EXPECT_EQ("layers.1.attention.wk.weight", (*plan)[3].source_name);
  EXPECT_EQ(3u, (*plan)[3].source_index);
  EXPECT_TRUE((*plan)[3].renamed());
  EXPECT_EQ(2, (*plan)[3].rule);
  EXPECT_FALSE((*plan)[6].renamed());  // no rule matches "step": kept
  EXPECT_EQ(-1, (*plan)[6].rule);
  EXPECT_FALSE((*plan)[0].cast());
}

TEST_F(TensorMappingTest, AWholeNameMustMatchAndTheFirstMatchingRuleDecides) {
  ConvertOptions o = WithRules("norm\\.weight=final_norm\n"       // not "layers.0.attention_norm.weight"
                               "(.*)\\.wq\\.(.*)=$1.q.$2\n"
                               "(.*)\\.attention\\.(.*)=never.$2\n"  // wq tensors matched the rule before
                               "(.*)=model.$&\n");                  // everything else
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(*source_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ((std::vector<std::string>{"model.tok_embeddings.weight", "layers.0.attention.q.weight",
                                      "model.layers.0.attention_norm.weight", "never.wk.weight", "final_norm",
                                      "model.output.weight", "optim.layers.0.attention.q.weight", "model.step"}),
            Names(*plan));
}

TEST_F(TensorMappingTest, TwoTensorsToOneNameOrAnEmptyNameIsRefusedNamingThem) {
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(*source_, WithRules(".*\\.wq\\.weight=q"));
  EXPECT_EQ(StatusCode::kInvalidArgument, plan.status().code());
  EXPECT_TRUE(StatusMentions(plan.status(), "'layers.0.attention.wq.weight'")) << plan.status().ToString();
  EXPECT_TRUE(StatusMentions(plan.status(), "'optim.layers.0.attention.wq.weight'")) << plan.status().ToString();
  EXPECT_TRUE(StatusMentions(plan.status(), "'q'")) << plan.status().ToString();
  // With the optimizer left out by --select (on the source's names), the same rule is fine.
  ConvertOptions selected = WithRules(".*\\.wq\\.weight=q");
  selected.select = {"layers."};
  plan = PlanExportTensors(*source_, selected);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  EXPECT_EQ((std::vector<std::string>{"q", "layers.0.attention_norm.weight", "layers.1.attention.wk.weight"}), Names(*plan));

  // A renamed tensor onto one that keeps its name.
  plan = PlanExportTensors(*source_, WithRules("output\\.weight=norm.weight"));
  EXPECT_EQ(StatusCode::kInvalidArgument, plan.status().code());
  EXPECT_TRUE(StatusMentions(plan.status(), "'norm.weight' and 'output.weight'")) << plan.status().ToString();

  plan = PlanExportTensors(*source_, WithRules("step="));
  EXPECT_EQ(StatusCode::kInvalidArgument, plan.status().code());
  EXPECT_TRUE(StatusMentions(plan.status(), "'step'")) << plan.status().ToString();
  EXPECT_TRUE(StatusMentions(plan.status(), "empty name")) << plan.status().ToString();

  ConvertOptions bad;
  bad.rename = {RenameRule{"(", "x"}};  // not through ParseRenameRule
  EXPECT_EQ(StatusCode::kInvalidArgument, PlanExportTensors(*source_, bad).status().code());
}

TEST_F(TensorMappingTest, DTypeCastsFloatingTensorsOnlyAndRefusesANonFloatingTarget) {
  ConvertOptions o;
  o.dtype = DType::kBF16;
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(*source_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  for (const ExportTensor& e : *plan) {
    if (e.name == "step") {
      EXPECT_FALSE(e.cast());
      EXPECT_EQ(DType::kI64, e.dtype);
    } else {
      EXPECT_TRUE(e.cast()) << e.name;
      EXPECT_EQ(DType::kF32, e.source_dtype);
      EXPECT_EQ(DType::kBF16, e.dtype);
    }
  }
  o.dtype = DType::kF32;  // what they are already: nothing to cast
  plan = PlanExportTensors(*source_, o);
  ASSERT_TRUE(plan.ok());
  for (const ExportTensor& e : *plan) EXPECT_FALSE(e.cast()) << e.name;

  for (DType target : {DType::kI32, DType::kF8E4M3}) {
    o.dtype = target;
    plan = PlanExportTensors(*source_, o);
    EXPECT_EQ(StatusCode::kInvalidArgument, plan.status().code());
    EXPECT_TRUE(StatusMentions(plan.status(), "'tok_embeddings.weight' (f32)")) << plan.status().ToString();
  }
}

TEST_F(TensorMappingTest, AMappedSourceCastsInPiecesOfItsScratch) {
  ConvertOptions o = WithRules("output\\.weight=lm_head.weight");
  o.dtype = DType::kF16;
  o.select = {"output.", "step"};
  Result<std::vector<ExportTensor>> plan = PlanExportTensors(*source_, o);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  MappedTensorSource mapped(*source_, *plan, /*scratch_bytes=*/12);  // 3 f32 elements a piece
  EXPECT_EQ(source_->description(), mapped.description());
  ASSERT_EQ(2u, mapped.tensors().size());
  EXPECT_EQ("lm_head.weight", mapped.tensors()[0].name);
  EXPECT_EQ(DType::kF16, mapped.tensors()[0].dtype);
  EXPECT_EQ((std::vector<int64_t>{4, 2}), mapped.tensors()[0].shape);
  EXPECT_EQ("step", mapped.tensors()[1].name);

  const TestTensor original = F32Tensor("output.weight", {4, 2}, 50);
  std::string expected(8 * 2, '\0');
  ASSERT_TRUE(CastElements(DType::kF32, DType::kF16, original.bytes.data(), expected.data(), 8, "x").ok());
  EXPECT_EQ(expected, ReadWhole(mapped, 0));
  // A box and a flat range inside it: rows 1..3, elements 1..4 of that box.
  std::string part(3 * 2, '\0');
  ASSERT_TRUE(mapped.Read(0, TensorRegion{{1, 0}, {3, 2}, 1, 4}, part.data()).ok());
  EXPECT_EQ(expected.substr(3 * 2, 3 * 2), part);
  EXPECT_EQ(std::string(8, '\0'), ReadWhole(mapped, 1));  // not cast: read as it is
  EXPECT_FALSE(mapped.Read(0, TensorRegion{{0, 0}, {5, 2}, 0, 10}, part.data()).ok());  // past the tensor
}

}  // namespace tensor_mapping_test
}  // namespace lifeline::test

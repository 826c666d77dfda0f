// Saves and reloads one tensor through the installed headers and library.
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "lifeline/checkpoint.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  lifeline::CheckpointerOptions opt;
  opt.directory = argv[1];
  opt.run_id = "consumer";
  auto ckpt = lifeline::Checkpointer::Open(opt);
  if (!ckpt.ok()) return std::fprintf(stderr, "%s\n", ckpt.status().ToString().c_str()), 1;
  std::vector<float> w(64), back(64, 0.f);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i);
  lifeline::SaveRequest save;
  save.tensors.push_back(lifeline::TensorShard::Whole("w", lifeline::DType::kF32, {8, 8}, w.data()));
  lifeline::Status s = (*ckpt)->Save(1, save).WaitPersisted();
  if (!s.ok()) return std::fprintf(stderr, "%s\n", s.ToString().c_str()), 1;
  lifeline::LoadRequest load;
  load.tensors.push_back(lifeline::TensorShard::Whole("w", lifeline::DType::kF32, {8, 8}, back.data()));
  auto r = (*ckpt)->Load(std::nullopt, load);
  if (!r.ok()) return std::fprintf(stderr, "%s\n", r.status().ToString().c_str()), 1;
  if (back != w) return std::fprintf(stderr, "loaded values differ\n"), 1;
  std::puts("consumer: ok");
  return 0;
}

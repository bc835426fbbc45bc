// Writes the seed corpus of the fuzz targets (tests/fuzz/corpus/<target>/):
// valid requests of each kind for FuzzConfig() and its baseline, and a few
// bad ones. Its output is committed; run it again after a change to the
// profile or the wire:  build-fuzz/tests/fuzz/fuzz_make_corpus tests/fuzz/corpus
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_common.h"

namespace indexer::fuzz {
namespace {

namespace fs = std::filesystem;
constexpr int kD = 128;

struct LayerShape {
  int heads;
  bool block;
};
// Layers of FuzzConfig(), in order.
const std::vector<LayerShape> kLayers = {{4, false}, {4, false}, {4, false}, {2, true}};

std::mt19937 rng(20261201);

v1::Tensor Fp32(std::vector<int64_t> shape, bool bf16 = false) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  v1::Tensor t;
  t.set_dtype(bf16 ? v1::BF16 : v1::FP32);
  for (int64_t d : shape) t.add_shape(d);
  std::string bytes;
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(rng);
    uint32_t b;
    std::memcpy(&b, &v, 4);
    if (bf16) {
      const uint16_t h = static_cast<uint16_t>(b >> 16);
      bytes.append(reinterpret_cast<const char*>(&h), 2);
    } else {
      bytes.append(reinterpret_cast<const char*>(&b), 4);
    }
  }
  t.set_data(bytes);
  return t;
}

v1::SequenceId Id(const std::string& name) {
  v1::SequenceId id;
  if (!name.empty() && name[0] == '#') {
    id.set_num(std::stoull(name.substr(1)));
  } else {
    id.set_name(name);
  }
  return id;
}

struct Seq {
  std::string name;  // "#7" = numeric id 7
  int q_len;
  bool create;
};

v1::StepRequest Header(const std::vector<Seq>& seqs) {
  v1::StepRequest r;
  for (const Seq& s : seqs) {
    v1::StepSequence* ss = r.mutable_header()->add_sequences();
    *ss->mutable_id() = Id(s.name);
    ss->set_q_len(s.q_len);
    ss->set_create(s.create);
  }
  r.mutable_header()->set_request_id("seed");
  return r;
}

v1::StepRequest Layer(int layer, int rows, bool bf16 = false) {
  v1::StepRequest r;
  v1::LayerRequest* l = r.mutable_layer();
  const LayerShape& s = kLayers[layer];
  l->set_layer(layer);
  *l->mutable_k() = Fp32({rows, kD}, bf16);
  *l->mutable_q() = Fp32({rows, s.heads, kD}, bf16);
  if (!s.block) *l->mutable_weights() = Fp32({rows, s.heads});
  return r;
}

v1::StepRequest Commit() {
  v1::StepRequest r;
  r.mutable_commit();
  return r;
}

// A whole committed step over `seqs`.
void Step(std::string* out, const std::vector<Seq>& seqs, bool bf16 = false) {
  int rows = 0;
  for (const Seq& s : seqs) rows += s.q_len;
  AppendRecord(out, Header(seqs).SerializeAsString());
  for (size_t l = 0; l < kLayers.size(); ++l) {
    AppendRecord(out, Layer(static_cast<int>(l), rows, bf16).SerializeAsString());
  }
  AppendRecord(out, Commit().SerializeAsString());
}

v1::WriteEntriesRequest Import(const std::string& name, bool create, int tokens,
                               int skip_layer = -1) {
  v1::WriteEntriesRequest r;
  *r.mutable_id() = Id(name);
  r.set_create(create);
  r.set_num_tokens(tokens);
  for (size_t l = 0; l < kLayers.size(); ++l) {
    if (static_cast<int>(l) == skip_layer) continue;
    v1::LayerEntries* e = r.add_layers();
    e->set_layer(l);
    *e->mutable_k() = Fp32({tokens, kD});
  }
  return r;
}

v1::ReleaseRequest ReleaseOf(const std::vector<std::string>& names) {
  v1::ReleaseRequest r;
  for (const std::string& n : names) *r.add_ids() = Id(n);
  return r;
}

void Write(const fs::path& dir, const std::string& name, const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream f(dir / name, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

void StepCorpus(const fs::path& dir) {
  std::string s;
  Step(&s, {{"new-1", 24, true}, {"#9", 5, true}});
  Write(dir, "prefill_create", s);
  s.clear();
  Step(&s, {{"base-a", 2, false}, {"#7", 1, false}});
  Write(dir, "decode_baseline", s);
  s.clear();
  Step(&s, {{"n", 30, true}});
  Step(&s, {{"n", 2, false}, {"base-a", 1, false}});
  Step(&s, {{"n", 1, false}});
  Write(dir, "create_then_decode", s);
  s.clear();
  Step(&s, {{"bf", 8, true}, {"#7", 2, false}}, /*bf16=*/true);
  Write(dir, "bf16", s);
  s.clear();
  // Aborted: the stream ends after two layers.
  AppendRecord(&s, Header({{"base-a", 1, false}, {"gone", 3, true}}).SerializeAsString());
  AppendRecord(&s, Layer(0, 4).SerializeAsString());
  AppendRecord(&s, Layer(1, 4).SerializeAsString());
  Write(dir, "aborted_mid_step", s);
  s.clear();
  // The consumer before its source: FAILED_PRECONDITION, then a good step.
  AppendRecord(&s, Header({{"#7", 1, false}}).SerializeAsString());
  AppendRecord(&s, Layer(1, 1).SerializeAsString());
  Step(&s, {{"#7", 1, false}});
  Write(dir, "consumer_first", s);
  s.clear();
  // A layer of the wrong shape (rows 3 for a step of 2).
  AppendRecord(&s, Header({{"base-a", 2, false}}).SerializeAsString());
  AppendRecord(&s, Layer(0, 3).SerializeAsString());
  Write(dir, "bad_shape", s);
  s.clear();
  AppendRecord(&s, Header({{"base-a", 1, false}}).SerializeAsString());
  AppendRecord(&s, Commit().SerializeAsString());
  Write(dir, "commit_too_early", s);
  s.clear();
  AppendRecord(&s, Header({{"base-a", 1, false}}).SerializeAsString());
  AppendRecord(&s, Header({{"#7", 1, false}}).SerializeAsString());
  Write(dir, "two_headers", s);
  s.clear();
  AppendRecord(&s, Header({{"base-a", 1, true}, {"#7", 0, false}}).SerializeAsString());
  AppendRecord(&s, Header({{"dup", 1, true}, {"dup", 1, true}}).SerializeAsString());
  AppendRecord(&s, Header({{"missing", 1, false}}).SerializeAsString());
  AppendRecord(&s, Header({{"big", 300, true}}).SerializeAsString());
  Write(dir, "bad_headers", s);
  s.clear();
  AppendRecord(&s, std::string("\xff\xff\xff", 3));
  AppendRecord(&s, Layer(0, 1).SerializeAsString());
  AppendRecord(&s, Commit().SerializeAsString());
  Write(dir, "undecodable_and_headless", s);
}

// fuzz_step_wire: one StepRequest per input, each record one slice.
void StepWireCorpus(const fs::path& dir) {
  const std::string dense = Layer(0, 3).SerializeAsString();
  std::string s;
  AppendRecord(&s, dense);
  Write(dir, "layer_one_slice", s);
  s.clear();
  // Cut inside the layer's length, a tensor's tag and Q's data.
  const size_t cuts[] = {0, 2, 9, dense.size() / 2, dense.size()};
  for (int i = 0; i + 1 < 5; ++i) AppendRecord(&s, dense.substr(cuts[i], cuts[i + 1] - cuts[i]));
  Write(dir, "layer_four_slices", s);
  s.clear();
  AppendRecord(&s, Layer(3, 2, /*bf16=*/true).SerializeAsString());
  Write(dir, "block_layer_bf16", s);
  s.clear();
  AppendRecord(&s, Header({{"a", 2, true}, {"#7", 1, false}}).SerializeAsString());
  Write(dir, "header", s);
  s.clear();
  AppendRecord(&s, dense.substr(0, dense.size() - 5));
  Write(dir, "truncated", s);
}

void ReleaseCorpus(const fs::path& dir) {
  std::string s;
  AppendRecord(&s, ReleaseOf({"#7"}).SerializeAsString());
  Write(dir, "numeric", s);
  s.clear();
  AppendRecord(&s, ReleaseOf({"base-a"}).SerializeAsString());
  AppendRecord(&s, ReleaseOf({"#7", "base-a"}).SerializeAsString());
  // An unknown id before the held one: NOT_FOUND (found by fuzz_release).
  AppendRecord(&s, ReleaseOf({"#46", "base-a"}).SerializeAsString());
  Write(dir, "held", s);
  s.clear();
  AppendRecord(&s, ReleaseOf({"#7", "unknown"}).SerializeAsString());
  AppendRecord(&s, ReleaseOf({"#7", "#7"}).SerializeAsString());
  AppendRecord(&s, ReleaseOf({}).SerializeAsString());
  AppendRecord(&s, ReleaseOf({""}).SerializeAsString());
  AppendRecord(&s, ReleaseOf({std::string(300, 'x')}).SerializeAsString());
  Write(dir, "bad", s);
}

void WriteEntriesCorpus(const fs::path& dir) {
  std::string s;
  AppendRecord(&s, Import("imp", true, 20).SerializeAsString());
  AppendRecord(&s, Import("imp", false, 3).SerializeAsString());
  Write(dir, "create_append", s);
  s.clear();
  AppendRecord(&s, Import("#7", false, 16).SerializeAsString());
  AppendRecord(&s, Import("base-a", false, 1).SerializeAsString());
  Write(dir, "append_baseline", s);
  s.clear();
  AppendRecord(&s, Import("base-a", true, 4).SerializeAsString());
  AppendRecord(&s, Import("nope", false, 4).SerializeAsString());
  AppendRecord(&s, Import("half", true, 4, /*skip_layer=*/2).SerializeAsString());
  v1::WriteEntriesRequest zero = Import("z", true, 1);
  zero.set_num_tokens(0);
  AppendRecord(&s, zero.SerializeAsString());
  v1::WriteEntriesRequest shape = Import("sh", true, 2);
  shape.set_num_tokens(3);
  AppendRecord(&s, shape.SerializeAsString());
  Write(dir, "bad", s);
}

v1::ExportEntriesRequest ExportOf(const std::string& name, uint64_t max_bytes,
                                  uint64_t max_tokens) {
  v1::ExportEntriesRequest r;
  if (!name.empty() && name[0] == '#') {
    r.mutable_id()->set_num(std::stoull(name.substr(1)));
  } else if (!name.empty()) {
    r.mutable_id()->set_name(name);
  }
  r.set_max_message_bytes(max_bytes);
  r.set_max_tokens(max_tokens);
  return r;
}

void ExportCorpus(const fs::path& dir) {
  std::string s;
  AppendRecord(&s, ExportOf("base-a", 0, 0).SerializeAsString());
  AppendRecord(&s, ExportOf("#7", 0, 3).SerializeAsString());
  Write(dir, "baseline", s);
  s.clear();
  AppendRecord(&s, ExportOf("base-a", 4096, 0).SerializeAsString());  // several messages
  AppendRecord(&s, ExportOf("base-a", 1200, 1).SerializeAsString());
  Write(dir, "small_messages", s);
  s.clear();
  AppendRecord(&s, ExportOf("nope", 0, 0).SerializeAsString());
  AppendRecord(&s, ExportOf("", 0, 0).SerializeAsString());
  AppendRecord(&s, ExportOf("base-a", 100, 0).SerializeAsString());       // too small
  AppendRecord(&s, ExportOf("base-a", 1 << 30, 0).SerializeAsString());   // over the daemon's
  AppendRecord(&s, ExportOf("base-a", 0, 1 << 20).SerializeAsString());   // over max_q_len
  Write(dir, "bad", s);
}

}  // namespace
}  // namespace indexer::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path root = argv[1];
  indexer::fuzz::StepCorpus(root / "step");
  indexer::fuzz::ReleaseCorpus(root / "release");
  indexer::fuzz::WriteEntriesCorpus(root / "write_entries");
  indexer::fuzz::ExportCorpus(root / "export");
  indexer::fuzz::StepWireCorpus(root / "step_wire");
  return 0;
}

// Device-resident inputs and outputs of Backend::RunLayer on the gpu backend:
// the same layer with host inputs and with device copies (and a device
// output) gives the same top-k and the same pool bytes, bit for bit; device
// K, weights or Q holding NaN (an e4m3fn NaN code in Q) fail the layer with
// INVALID_ARGUMENT naming the field. Skips without a GPU.
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/format/fp8.h"
#include "kernels/format/mxfp4.h"
#include "kernels/geometry/step_geometry.h"
#include "kernels/gpu/gpu_backend.h"
#include "kernels/gpu/gpu_compat.h"

namespace indexer {
namespace {

#define SKIP_WITHOUT_GPU()                                           \
  if (GpuDeviceCount() == 0) {                                       \
    GTEST_SKIP() << "no GPU: GpuDeviceCount() == 0 on this machine"; \
  }

// A cudaMalloc'd copy of `bytes` host bytes, freed with the object.
class DeviceCopy {
 public:
  DeviceCopy(const void* host, size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(gpu::Malloc(&p_, bytes > 0 ? bytes : 1), gpu::kSuccess);
    if (bytes > 0) {
      EXPECT_EQ(gpu::CopyH2D(p_, host, bytes, nullptr), gpu::kSuccess);
      EXPECT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
    }
  }
  ~DeviceCopy() { (void)gpu::Free(p_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void* get() const { return p_; }
  std::vector<uint8_t> ToHost() const {
    std::vector<uint8_t> h(bytes_);
    EXPECT_EQ(gpu::CopyD2H(h.data(), p_, bytes_, nullptr), gpu::kSuccess);
    EXPECT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
    return h;
  }

 private:
  void* p_ = nullptr;
  size_t bytes_;
};

struct Inputs {
  std::vector<float> k_f32;
  std::vector<uint8_t> k_quant;
  std::vector<uint8_t> q_values, q_scales;
  std::vector<float> weights;
  std::vector<float> block_q;
};

Inputs MakeInputs(std::mt19937& rng, const PageLayout& L, int64_t n_new, int32_t rows,
                  int32_t heads) {
  Inputs in;
  std::normal_distribution<float> nd(0.f, 1.f);
  in.k_f32.resize(static_cast<size_t>(n_new * L.head_dim));
  for (float& x : in.k_f32) x = nd(rng);
  in.k_quant.resize(static_cast<size_t>(n_new * L.entry_bytes()));
  for (int64_t i = 0; i < n_new; ++i) {
    uint8_t* e = in.k_quant.data() + i * L.entry_bytes();
    const float* x = in.k_f32.data() + i * L.head_dim;
    if (L.format == KvFormat::kFp8) {
      const float s = QuantizeFp8Entry(x, L.head_dim, true, e);
      std::memcpy(e + L.value_bytes(), &s, 4);
    } else {
      QuantizeMxfp4(x, L.head_dim, e, e + L.value_bytes());
    }
  }
  const int64_t rh = int64_t{rows} * heads;
  std::uniform_int_distribution<int> byte(0, 255), ex(124, 130);
  in.q_values.resize(static_cast<size_t>(rh * L.value_bytes()));
  for (uint8_t& v : in.q_values) {
    v = static_cast<uint8_t>(byte(rng));
    if (L.format == KvFormat::kFp8 && (v & 0x7f) == 0x7f) v ^= 1;
  }
  if (L.format == KvFormat::kMxfp4) {
    in.q_scales.resize(static_cast<size_t>(rh * (L.head_dim / 32)));
    for (uint8_t& s : in.q_scales) s = static_cast<uint8_t>(ex(rng));
  }
  in.weights.resize(static_cast<size_t>(rh));
  for (float& w : in.weights) w = nd(rng) / 64.f;
  in.block_q.resize(static_cast<size_t>(rh * L.head_dim));
  for (float& x : in.block_q) x = nd(rng);
  return in;
}

struct Case {
  KvFormat format;
  LayerKind kind;
  KInput::Kind k_kind;
  ConsumerMode mode = ConsumerMode::kAuto;  // consumers
};

std::string Name(const Case& c) {
  const char* kinds[] = {"dense", "source", "consumer", "block"};
  const char* ks[] = {"f32", "bf16", "quantized"};
  const char* modes[] = {"", " gather", " masked"};
  return std::string(KvFormatName(c.format)) + " " + kinds[static_cast<int>(c.kind)] +
         modes[static_cast<int>(c.mode)] + " k " + ks[static_cast<int>(c.k_kind)];
}

// One step over three sequences (decode, short prefill, new), run through
// RunLayer on two pools of one backend: host inputs and output on pool A,
// device copies and a device output on pool B. A consumer runs after its
// source on the same pool and step, both walks (its top-k writes the entries
// of its pool slots straight into a device output).
TEST(GpuDeviceTensors, SameLayerHostAndDeviceBitForBit) {
  SKIP_WITHOUT_GPU();
  auto be_or = MakeGpuBackend(0, 0);
  ASSERT_TRUE(be_or.ok()) << be_or.status();
  Backend& be = **be_or;
  const std::vector<Case> cases = {
      {KvFormat::kFp8, LayerKind::kDense, KInput::Kind::kFloat32},
      {KvFormat::kFp8, LayerKind::kDense, KInput::Kind::kQuantized},
      {KvFormat::kMxfp4, LayerKind::kDense, KInput::Kind::kFloat32},
      {KvFormat::kMxfp4, LayerKind::kDense, KInput::Kind::kQuantized},
      {KvFormat::kFp8, LayerKind::kCandidateSource, KInput::Kind::kFloat32},
      {KvFormat::kFp8, LayerKind::kCandidateConsumer, KInput::Kind::kQuantized, ConsumerMode::kGather},
      {KvFormat::kFp8, LayerKind::kCandidateConsumer, KInput::Kind::kQuantized, ConsumerMode::kMasked},
      {KvFormat::kMxfp4, LayerKind::kCandidateConsumer, KInput::Kind::kQuantized},
      {KvFormat::kMxfp4, LayerKind::kBlock, KInput::Kind::kQuantized},
  };
  std::mt19937 rng(99);
  for (const Case& c : cases) {
    SCOPED_TRACE(Name(c));
    PageLayout L;
    L.format = c.format;
    L.head_dim = 128;
    L.page_entries = 64;
    const int32_t heads = c.kind == LayerKind::kBlock ? 4 : 64, topk = 64;
    const std::vector<int64_t> old_tokens = {300, 100, 0}, q_lens = {1, 37, 5};
    std::vector<std::vector<int32_t>> pages;
    int32_t next = 0;
    for (size_t s = 0; s < old_tokens.size(); ++s) {
      pages.emplace_back();
      for (int64_t i = 0; i < PagesForTokens(old_tokens[s] + q_lens[s], 1, 64); ++i) {
        pages.back().push_back(next++);
      }
    }
    // Cache filled from 0 in this step: the write and the scoring both see
    // the step's entries.
    const StepRows rows =
        BuildStepRowsFromPages(old_tokens, q_lens, pages, 1, int64_t{1} << 30, {0, 0, 0});
    auto pool_a = be.AllocatePool(L, next), pool_b = be.AllocatePool(L, next);
    ASSERT_TRUE(pool_a.ok() && pool_b.ok());
    auto ctx_a = be.PrepareStep(L, rows), ctx_b = be.PrepareStep(L, rows);
    ASSERT_TRUE(ctx_a.ok() && ctx_b.ok());
    const Inputs in = MakeInputs(rng, L, rows.NewEntries(), rows.num_rows, heads);

    KInput k_host;
    k_host.kind = c.k_kind;
    k_host.data = c.k_kind == KInput::Kind::kQuantized ? static_cast<const void*>(in.k_quant.data())
                                                       : in.k_f32.data();
    const size_t k_bytes = c.k_kind == KInput::Kind::kQuantized ? in.k_quant.size()
                                                                : in.k_f32.size() * 4;
    DeviceCopy k_dev(k_host.data, k_bytes);
    DeviceCopy qv_dev(in.q_values.data(), in.q_values.size());
    DeviceCopy qs_dev(in.q_scales.data(), in.q_scales.size());
    DeviceCopy w_dev(in.weights.data(), in.weights.size() * 4);

    LayerWork a;
    a.kind = c.kind;
    a.k = &k_host;
    a.q = {heads, in.q_values.data(), in.q_scales.empty() ? nullptr : in.q_scales.data(),
           in.weights.data()};
    a.block_q = {heads, in.block_q.data()};
    a.topk = topk;
    // Pools of 16 blocks of 8 (128 entries, more than the top-k's 64; the
    // new sequence's rows see fewer and are listed whole).
    a.candidate.topk_blocks = 16;
    a.mode = c.mode;
    a.block.topk_blocks = 6;
    a.block.init_blocks = 1;
    a.block.local_blocks = 2;
    const size_t n_out = c.kind == LayerKind::kBlock
                             ? size_t{4} * rows.num_rows * a.block.topk_blocks
                             : size_t{1} * rows.num_rows * topk;
    std::vector<int32_t> out_a(n_out, -7);
    if (c.kind == LayerKind::kCandidateConsumer) {
      // Its candidate set's source first, on both pools (host output; the
      // consumer then writes the same K entries again).
      LayerWork src = a;
      src.kind = LayerKind::kCandidateSource;
      std::vector<int32_t> src_out(n_out, -7);
      src.out = src_out.data();
      auto sa = be.RunLayer(*pool_a, ctx_a->get(), src);
      ASSERT_TRUE(sa.ok()) << sa.status();
      auto sb = be.RunLayer(*pool_b, ctx_b->get(), src);
      ASSERT_TRUE(sb.ok()) << sb.status();
    }
    a.out = out_a.data();
    auto ta = be.RunLayer(*pool_a, ctx_a->get(), a);
    ASSERT_TRUE(ta.ok()) << ta.status();
    EXPECT_GT(ta->logits_us, 0.0);
    EXPECT_GT(ta->write_us, 0.0);

    KInput k_on = k_host;
    k_on.data = k_dev.get();
    k_on.on_device = true;
    LayerWork b = a;
    b.k = &k_on;
    if (c.kind != LayerKind::kBlock) {
      b.q.values = static_cast<const uint8_t*>(qv_dev.get());
      b.q.scales = in.q_scales.empty() ? nullptr : static_cast<const uint8_t*>(qs_dev.get());
      b.q.weights = static_cast<const float*>(w_dev.get());
      b.q.on_device = true;
    }
    std::vector<int32_t> sentinel(n_out, -7);
    DeviceCopy out_dev(sentinel.data(), n_out * 4);
    b.out = static_cast<int32_t*>(out_dev.get());
    b.out_on_device = true;
    auto tb = be.RunLayer(*pool_b, ctx_b->get(), b);
    ASSERT_TRUE(tb.ok()) << tb.status();

    const std::vector<uint8_t> got = out_dev.ToHost();
    ASSERT_EQ(got.size(), n_out * 4);
    // The same set in every row (the order inside a row is unspecified,
    // SPEC §5 / LayerReply.topk).
    const size_t width = c.kind == LayerKind::kBlock ? a.block.topk_blocks : topk;
    std::vector<int32_t> dev_out(n_out);
    std::memcpy(dev_out.data(), got.data(), got.size());
    for (size_t row = 0; row * width < n_out; ++row) {
      std::vector<int32_t> x(out_a.begin() + row * width, out_a.begin() + (row + 1) * width);
      std::vector<int32_t> y(dev_out.begin() + row * width, dev_out.begin() + (row + 1) * width);
      std::sort(x.begin(), x.end());
      std::sort(y.begin(), y.end());
      ASSERT_EQ(x, y) << "device-output top-k row " << row << " differs from the host run";
    }
    // Something was selected (not the sentinel everywhere).
    EXPECT_NE(out_a[0], -7);
    // Pools: the same entries written.
    std::vector<uint8_t> pa(static_cast<size_t>(next * L.page_bytes())), pb(pa.size());
    ASSERT_EQ(gpu::CopyD2H(pa.data(), pool_a->base, pa.size(), nullptr), gpu::kSuccess);
    ASSERT_EQ(gpu::CopyD2H(pb.data(), pool_b->base, pb.size(), nullptr), gpu::kSuccess);
    ASSERT_EQ(gpu::StreamSynchronize(nullptr), gpu::kSuccess);
    EXPECT_EQ(pa, pb) << "device K wrote different pool bytes";
  }
}

TEST(GpuDeviceTensors, NonFiniteDeviceInputsFailNamingTheField) {
  SKIP_WITHOUT_GPU();
  auto be_or = MakeGpuBackend(0, 0);
  ASSERT_TRUE(be_or.ok()) << be_or.status();
  Backend& be = **be_or;
  PageLayout L;
  L.format = KvFormat::kFp8;
  L.head_dim = 128;
  L.page_entries = 64;
  const std::vector<std::vector<int32_t>> pages = {{0}, {1}};
  const StepRows rows = BuildStepRowsFromPages({10, 0}, {1, 3}, pages, 1, int64_t{1} << 30);
  auto pool = be.AllocatePool(L, 2);
  ASSERT_TRUE(pool.ok());
  auto ctx = be.PrepareStep(L, rows);
  ASSERT_TRUE(ctx.ok());
  std::mt19937 rng(5);
  Inputs in = MakeInputs(rng, L, rows.NewEntries(), rows.num_rows, 64);
  // The check reads 16-byte units (device tensors are 16-byte aligned: the
  // logits kernels load Q so, and region offsets must be): "q last" and
  // "weights last" put the bad element in the last unit.
  for (const std::string field : {"k", "weights", "k quantized", "q", "q last", "weights last",
                                   "q and weights"}) {
    SCOPED_TRACE(field);
    Inputs bad = in;
    const int64_t q_bytes = static_cast<int64_t>(bad.q_values.size());
    if (field == "k") bad.k_f32[130] = std::nanf("");
    if (field == "weights") bad.weights[7] = INFINITY;
    if (field == "k quantized") bad.k_quant[1] = 0x7f;  // e4m3 NaN code
    if (field == "q") bad.q_values[300] = 0xff;          // e4m3fn NaN code (negative)
    if (field == "q last") bad.q_values[q_bytes - 1] = 0x7f;
    if (field == "weights last") bad.weights.back() = std::nanf("");
    if (field == "q and weights") {  // two parts bad: weights are named before q
      bad.q_values[17] = 0x7f;
      bad.q_values[16] = 0xff;
      bad.weights[70] = -INFINITY;
    }
    const bool quant = field == "k quantized";
    KInput k;
    k.kind = quant ? KInput::Kind::kQuantized : KInput::Kind::kFloat32;
    DeviceCopy k_dev(quant ? static_cast<const void*>(bad.k_quant.data()) : bad.k_f32.data(),
                     quant ? bad.k_quant.size() : bad.k_f32.size() * 4);
    k.data = k_dev.get();
    k.on_device = true;
    DeviceCopy qv(bad.q_values.data(), bad.q_values.size()), w(bad.weights.data(), bad.weights.size() * 4);
    LayerWork work;
    work.k = &k;
    work.q = {64, static_cast<const uint8_t*>(qv.get()), nullptr, static_cast<const float*>(w.get()),
              true};
    work.topk = 8;
    std::vector<int32_t> out(static_cast<size_t>(rows.num_rows) * 8);
    work.out = out.data();
    auto t = be.RunLayer(*pool, ctx->get(), work);
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << t.status();
    const std::string want =
        field == "weights"        ? "weights: element 7"
        : field == "weights last" ? absl::StrCat("weights: element ", bad.weights.size() - 1)
        : field == "q and weights" ? "weights: element 70"
        : field == "q"            ? "q: byte 300 of the device tensor is an e4m3fn NaN code"
        : field == "q last"       ? absl::StrCat("q: byte ", q_bytes - 1, " of the device tensor")
        : quant                   ? "k: element 0"
                                  : "k: element 130";
    EXPECT_NE(std::string(t.status().message()).find(want), std::string::npos) << t.status();
  }
  // Clean inputs pass on the same backend afterwards (the flags are reset).
  // 0x80 is e4m3fn's -0 (a NaN only in e4m3fnuz): Q holding it is finite.
  in.q_values[3] = 0x80;
  KInput k;
  DeviceCopy k_dev(in.k_f32.data(), in.k_f32.size() * 4);
  k.data = k_dev.get();
  k.on_device = true;
  DeviceCopy qv(in.q_values.data(), in.q_values.size()), w(in.weights.data(), in.weights.size() * 4);
  LayerWork work;
  work.k = &k;
  work.q = {64, static_cast<const uint8_t*>(qv.get()), nullptr, static_cast<const float*>(w.get()),
            true};
  work.topk = 8;
  std::vector<int32_t> out(static_cast<size_t>(rows.num_rows) * 8);
  work.out = out.data();
  auto t = be.RunLayer(*pool, ctx->get(), work);
  EXPECT_TRUE(t.ok()) << t.status();
}

}  // namespace
}  // namespace indexer

#include "server/core/engine.h"

#include <algorithm>
#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_join.h"
#include "kernels/common/status_macros.h"
#include "server/core/layer_inputs.h"
#include "kernels/geometry/step_geometry.h"

namespace indexer {
namespace {

double MicrosSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

// The namespace is length-prefixed: with a plain separator, namespace "a$b"
// with id #1 and namespace "a" with name "b#1" would share a key.
SeqName SeqName::Numeric(uint64_t id, const std::string& ns) {
  return {absl::StrCat(ns.size(), ":", ns, "#", id), absl::StrCat(id)};
}

SeqName SeqName::Named(const std::string& name, const std::string& ns) {
  // Escaped in messages (and so in logs): a name cannot forge a log line.
  return {absl::StrCat(ns.size(), ":", ns, "$", name), absl::StrCat("\"", absl::CEscape(name), "\"")};
}

// ------------------------------------------------------------------ Engine --

Engine::Engine(Model model, std::unique_ptr<Backend> backend)
    : model_(std::move(model)), backend_(std::move(backend)) {}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    Model model, std::unique_ptr<Backend> backend) {
  const Backend::Paths paths = backend->SupportedPaths();
  for (int32_t l = 0; l < model.num_layers(); ++l) {
    const LayerRoleKind kind = model.layer_role[l].kind;
    const bool needs_candidate = kind == LayerRoleKind::kCandidateSource ||
                                 kind == LayerRoleKind::kCandidateConsumer;
    if ((needs_candidate && !paths.candidate) || (kind == LayerRoleKind::kBlock && !paths.block)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "device: layer ", l, " is a ", LayerRoleName(kind), " layer, which the ",
          backend->Describe(), " backend does not implement yet; expected --device cpu for "
          "profile '", model.config.profile(), "'"));
    }
  }
  std::unique_ptr<Engine> e(new Engine(std::move(model), std::move(backend)));
  e->pools_.assign(e->model_.num_layers(), PoolHandle{});
  absl::MutexLock lock(&e->mu_);
  for (const GroupSpec& g : e->model_.groups) {
    e->allocators_.emplace_back(g.pages);
    for (int32_t layer : g.layers) {
      auto pool = e->backend_->AllocatePool(g.layout, g.pages);
      if (!pool.ok()) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "K pool of layer ", layer, " (", g.pages, " pages of ",
            g.layout.page_bytes(), " B): ", pool.status().message()));
      }
      e->pools_[layer] = *pool;
    }
  }
  return e;
}

absl::StatusOr<std::unique_ptr<Step>> Engine::BeginStep(const StepSpec& spec) {
  const config::ServerConfig& cfg = model_.config;
  RETURN_IF_ERROR(CheckDevice());
  const size_t n = spec.seqs.size();
  if (n == 0) {
    return absl::InvalidArgumentError("header.sequences: expected at least one sequence");
  }
  if (n > cfg.max_batch()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header.sequences: ", n, " sequences; expected at most max_batch = ", cfg.max_batch()));
  }
  absl::flat_hash_map<std::string, size_t> first_at;
  for (size_t i = 0; i < n; ++i) {
    const StepSequenceSpec& s = spec.seqs[i];
    const auto f = [i] { return absl::StrCat("header.sequences[", i, "]"); };
    if (s.q_len < 1 || s.q_len > cfg.max_q_len()) {
      return absl::InvalidArgumentError(absl::StrCat(
          f(), ".q_len: expected 1..", cfg.max_q_len(), ", got ", s.q_len));
    }
    auto [it, inserted] = first_at.emplace(s.name.key, i);
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          f(), ".id: sequence ", s.name.display,
          " appears twice in the step (first at header.sequences[", it->second,
          "]); expected each sequence at most once"));
    }
  }

  const auto t_begin = std::chrono::steady_clock::now();
  std::unique_ptr<Step> step(new Step(this));
  step->id_ = spec.request_id.empty() ? absl::StrCat("step-", ++step_counter_)
                                      : spec.request_id;
  const size_t G = model_.groups.size();
  std::vector<std::vector<StepRowsInput>> per_group(G, std::vector<StepRowsInput>(n));
  {
    absl::MutexLock lock(&mu_);
    if (open_steps_.load() >= static_cast<int32_t>(cfg.max_open_steps())) {
      metrics_.Rejected(Rejection::kLimits);
      return absl::ResourceExhaustedError(absl::StrCat(
          "admission: ", open_steps_.load(), " steps open; max_open_steps = ",
          cfg.max_open_steps()));
    }
    std::vector<const Sequence*> found(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const StepSequenceSpec& s = spec.seqs[i];
      // Only on failure: the field name is not built for every sequence.
      const auto f = [i] { return absl::StrCat("header.sequences[", i, "]"); };
      auto it = seqs_.find(s.name.key);
      if (s.create) {
        if (it != seqs_.end()) {
          return absl::AlreadyExistsError(absl::StrCat(
              f(), ".id: sequence ", s.name.display,
              " already exists; expected a new id with create = true"));
        }
      } else {
        if (it == seqs_.end()) {
          return absl::NotFoundError(absl::StrCat(
              f(), ".id: unknown sequence ", s.name.display,
              "; set create = true to start one"));
        }
        if (it->second->busy) {
          return absl::FailedPreconditionError(absl::StrCat(
              f(), ".id: sequence ", s.name.display, " is in another open step"));
        }
        found[i] = it->second.get();
      }
      const int64_t old_len = found[i] ? found[i]->len : 0;
      if (old_len + s.q_len > static_cast<int64_t>(cfg.max_seq_len())) {
        return absl::InvalidArgumentError(absl::StrCat(
            f(), ".q_len: sequence would hold ", old_len + s.q_len,
            " tokens; expected at most max_seq_len = ", cfg.max_seq_len()));
      }
    }

    // Pages, all groups or none: count first, then take.
    std::vector<std::vector<int64_t>> extra(G, std::vector<int64_t>(n, 0));
    for (size_t g = 0; g < G; ++g) {
      const GroupSpec& gs = model_.groups[g];
      int64_t need = 0;
      for (size_t i = 0; i < n; ++i) {
        const int64_t old_len = found[i] ? found[i]->len : 0;
        const int64_t have = found[i] ? static_cast<int64_t>(found[i]->pages[g].size()) : 0;
        extra[g][i] = PagesFor(EntriesFor(old_len + spec.seqs[i].q_len, gs.compress_ratio),
                               gs.layout.page_entries) - have;
        need += extra[g][i];
      }
      if (need > allocators_[g].free()) {
        metrics_.Rejected(Rejection::kLimits);
        return absl::ResourceExhaustedError(absl::StrCat(
            "pages: layer group '", gs.name, "' needs ", need, " more pages, ",
            allocators_[g].free(), " of ", allocators_[g].total(), " free"));
      }
    }
    std::vector<std::vector<std::vector<int32_t>>> taken(n, std::vector<std::vector<int32_t>>(G));
    for (size_t g = 0; g < G; ++g) {
      for (size_t i = 0; i < n; ++i) {
        // Cannot fail: the loop above checked the group's total.
        taken[i][g] = std::move(allocators_[g].Allocate(extra[g][i])).value();
      }
    }

    step->new_pages_ = std::move(taken);

    // Lock the sequences; new ones enter the registry busy and empty. Their
    // block tables are only read from here on: nothing else touches a busy
    // sequence until the step ends.
    for (size_t i = 0; i < n; ++i) {
      const StepSequenceSpec& s = spec.seqs[i];
      Sequence* seq;
      if (s.create) {
        auto fresh = std::make_unique<Sequence>();
        fresh->pages.resize(G);
        seq = fresh.get();
        seqs_.emplace(s.name.key, std::move(fresh));
      } else {
        seq = seqs_.find(s.name.key)->second.get();
      }
      seq->busy = true;
      step->keys_.push_back(s.name.key);
      step->created_.push_back(s.create);
      step->new_len_.push_back(seq->len + s.q_len);
      for (size_t g = 0; g < G; ++g) {
        per_group[g][i] = {seq->len, s.q_len, &seq->pages[g], &step->new_pages_[i][g]};
      }
    }
    open_steps_.fetch_add(1);
  }

  // Each group's rows are built once and handed to the backend's context,
  // which owns them (and on the gpu uploads them) for the whole step.
  const auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
  auto t = std::chrono::steady_clock::now();
  step->begin_times_.admit_us = us(t_begin, t);
  for (size_t g = 0; g < G; ++g) {
    const GroupSpec& gs = model_.groups[g];
    StepRows rows = BuildStepRows(per_group[g], gs.compress_ratio, model_.logits_budget_bytes());
    const auto t_rows = std::chrono::steady_clock::now();
    step->begin_times_.rows_us += us(t, t_rows);
    auto ctx = backend_->PrepareStep(gs.layout, std::move(rows));
    t = std::chrono::steady_clock::now();
    step->begin_times_.prepare_us += us(t_rows, t);
    if (!ctx.ok()) return NoteDeviceStatus(ctx.status());  // ~Step rolls back
    step->ctx_.push_back(std::move(ctx).value());
  }
  step->num_rows_ = G > 0 ? step->ctx_[0]->rows().num_rows : 0;
  step->layer_done_.assign(model_.num_layers(), false);
  step->source_done_.assign(model_.candidate_sets.size(), false);
  return step;
}

std::string Step::PrepareParts() const {
  std::string out;
  for (const auto& ctx : ctx_) {
    std::string part = ctx->PrepareParts();
    if (part.empty()) continue;
    absl::StrAppend(&out, out.empty() ? "" : "; ", part);
  }
  return out;
}

void Engine::FinishStep(Step* step, bool commit) {
  const Clock::time_point now = Clock::now();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < step->keys_.size(); ++i) {
    auto it = seqs_.find(step->keys_[i]);
    Sequence* seq = it->second.get();
    if (commit) {
      seq->len = step->new_len_[i];
      for (size_t g = 0; g < seq->pages.size(); ++g) {
        auto& fresh = step->new_pages_[i][g];
        seq->pages[g].insert(seq->pages[g].end(), fresh.begin(), fresh.end());
      }
      seq->busy = false;
      seq->last_used = now;
    } else {
      for (size_t g = 0; g < allocators_.size(); ++g) {
        allocators_[g].Free(step->new_pages_[i][g]);
      }
      if (step->created_[i]) {
        seqs_.erase(it);
      } else {
        seq->busy = false;
        seq->last_used = now;
      }
    }
  }
  open_steps_.fetch_sub(1);
}

absl::StatusOr<int64_t> Engine::Release(const std::vector<SeqName>& names) {
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < names.size(); ++i) {
    auto it = seqs_.find(names[i].key);
    if (it == seqs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("ids[", i, "]: unknown sequence ", names[i].display));
    }
    if (it->second->busy) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ids[", i, "]: sequence ", names[i].display, " is in an open step"));
    }
    if (it->second->exports > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ids[", i, "]: sequence ", names[i].display,
          " is being exported (ExportEntries); expected the export to end first"));
    }
  }
  int64_t freed = 0;
  for (const SeqName& name : names) {
    auto it = seqs_.find(name.key);
    if (it == seqs_.end()) continue;  // named twice in the request
    for (size_t g = 0; g < allocators_.size(); ++g) {
      allocators_[g].Free(it->second->pages[g]);
      freed += static_cast<int64_t>(it->second->pages[g].size());
    }
    seqs_.erase(it);
  }
  return freed;
}

absl::StatusOr<int64_t> Engine::Import(
    const SeqName& name, bool create, int64_t num_tokens,
    const std::vector<std::pair<int32_t, TensorView>>& layers) {
  StepSpec spec;
  spec.seqs.push_back({name, num_tokens, create});
  spec.request_id = absl::StrCat("import-", ++step_counter_);
  // Check the layer list before taking pages.
  std::vector<bool> seen(model_.num_layers(), false);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int32_t l = layers[i].first;
    if (l < 0 || l >= model_.num_layers()) {
      return absl::NotFoundError(absl::StrCat("layers[", i, "].layer: unknown layer ", l,
                                              "; expected 0..", model_.num_layers() - 1));
    }
    if (seen[l]) {
      return absl::InvalidArgumentError(
          absl::StrCat("layers[", i, "].layer: layer ", l, " appears twice"));
    }
    seen[l] = true;
  }
  for (int32_t l = 0; l < model_.num_layers(); ++l) {
    if (!seen[l]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layers: layer ", l, " is missing; expected entries for every layer 0..",
          model_.num_layers() - 1));
    }
  }
  auto begun = BeginStep(spec);
  if (!begun.ok()) {
    // BeginStep speaks of a step header; a WriteEntriesRequest names the
    // same things `id` and `num_tokens`.
    return absl::Status(begun.status().code(),
                        absl::StrReplaceAll(begun.status().message(),
                                            {{"header.sequences[0].id", "id"},
                                             {"header.sequences[0].q_len", "num_tokens"}}));
  }
  std::unique_ptr<Step> step = *std::move(begun);
  for (size_t i = 0; i < layers.size(); ++i) {
    absl::Status s = step->WriteLayer(layers[i].first, layers[i].second);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("layers[", i, "].", s.message()));
    }
  }
  ASSIGN_OR_RETURN(std::vector<int64_t> lens, step->Commit());
  return lens[0];
}

std::vector<GroupUsage> Engine::Usage() const {
  absl::MutexLock lock(&mu_);
  std::vector<GroupUsage> out;
  for (const PageAllocator& a : allocators_) out.push_back({a.total(), a.free()});
  return out;
}

MetricsGauges Engine::Gauges() const {
  MetricsGauges out;
  out.heap = ReadProcessHeap();  // outside mu_: it takes the allocator's locks
  absl::MutexLock lock(&mu_);
  for (size_t g = 0; g < allocators_.size(); ++g) {
    out.groups.push_back({model_.groups[g].name, allocators_[g].total(), allocators_[g].free()});
  }
  out.sequences = static_cast<int64_t>(seqs_.size());
  out.open_steps = open_steps_.load();
  return out;
}

int64_t Engine::num_sequences() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(seqs_.size());
}

absl::StatusOr<int64_t> Engine::SequenceLength(const SeqName& name) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(name.key);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", name.display));
  return it->second->len;
}

absl::StatusOr<std::vector<int32_t>> Engine::SequencePages(const SeqName& name,
                                                           int32_t group) const {
  absl::MutexLock lock(&mu_);
  auto it = seqs_.find(name.key);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("unknown sequence ", name.display));
  return it->second->pages[group];
}

absl::Status Engine::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  for (size_t g = 0; g < allocators_.size(); ++g) {
    RETURN_IF_ERROR(allocators_[g].CheckInvariant());
    const GroupSpec& gs = model_.groups[g];
    int64_t held = 0;
    bool any_busy = false;
    for (const auto& [key, seq] : seqs_) {
      held += static_cast<int64_t>(seq->pages[g].size());
      any_busy |= seq->busy;
      const int64_t want = PagesFor(EntriesFor(seq->len, gs.compress_ratio), gs.layout.page_entries);
      if (static_cast<int64_t>(seq->pages[g].size()) != want) {
        return absl::InternalError(absl::StrCat("sequence ", key, " holds ",
                                                seq->pages[g].size(), " pages in group ",
                                                gs.name, "; expected ", want));
      }
    }
    // Open steps hold pages not yet in any block table.
    if (!any_busy && held != allocators_[g].used()) {
      return absl::InternalError(absl::StrCat("group ", gs.name, ": sequences hold ", held,
                                              " pages, allocator has ",
                                              allocators_[g].used(), " used"));
    }
  }
  return absl::OkStatus();
}

// -------------------------------------------------------------------- Step --

Step::Step(Engine* engine) : engine_(engine) {}

Step::~Step() { Abort(); }

int32_t Step::num_rows() const { return num_rows_; }

std::vector<int64_t> Step::reserved_pages() const {
  std::vector<int64_t> pages(engine_->model_.groups.size(), 0);
  for (const auto& per_seq : new_pages_) {
    for (size_t g = 0; g < per_seq.size(); ++g) pages[g] += static_cast<int64_t>(per_seq[g].size());
  }
  return pages;
}

void Step::Abort() {
  if (finished_ || keys_.empty()) {
    finished_ = true;
    return;
  }
  finished_ = true;
  ctx_.clear();
  engine_->FinishStep(this, /*commit=*/false);
}

absl::Status Step::CheckLayer(int32_t layer) const {
  if (finished_) return absl::FailedPreconditionError("step: already finished");
  const Model& m = engine_->model_;
  if (layer < 0 || layer >= m.num_layers()) {
    return absl::NotFoundError(absl::StrCat("layer: unknown layer ", layer,
                                            "; expected 0..", m.num_layers() - 1));
  }
  if (layer_done_[layer]) {
    return absl::FailedPreconditionError(
        absl::StrCat("layer: layer ", layer, " was already sent in this step"));
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Step::WriteK(int32_t group, int32_t layer, const KInput& k) {
  const StepRows& rows = ctx_[group]->rows();
  if (rows.NewEntries() == 0) return 0.0;
  absl::StatusOr<double> us = engine_->backend_->WriteEntries(
      engine_->model_.groups[group].layout, engine_->pools_[layer], rows, ctx_[group].get(), k);
  if (!us.ok()) return engine_->NoteDeviceStatus(us.status());
  return us;
}

absl::Status Step::WriteLayer(int32_t layer, const TensorView& k) {
  RETURN_IF_ERROR(CheckLayer(layer));
  const int32_t group = engine_->model_.layer_group[layer];
  std::vector<uint8_t> converted;  // K of the other FP8 variant, converted
  ASSIGN_OR_RETURN(KInput kin, ValidateK(engine_->model_.groups[group],
                                         ctx_[group]->rows().NewEntries(), k, &converted));
  RETURN_IF_ERROR(WriteK(group, layer, kin).status());
  layer_done_[layer] = true;
  return absl::OkStatus();
}

namespace {

// The host form of `t`: itself, or for a device tensor its bytes copied
// through the backend into `buf` (same dtype and shape, so the usual checks
// and messages apply).
absl::StatusOr<TensorView> HostView(Backend& b, absl::string_view field, const TensorView& t,
                                    std::string* buf) {
  if (!t.on_device) return t;
  if (t.device_bytes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": expected a byte size >= 0, got ", t.device_bytes));
  }
  buf->resize(static_cast<size_t>(t.device_bytes));
  absl::Status s = b.CopyDeviceToHost(buf->data(), t.device_ptr, t.device_bytes);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(field, ": ", s.message()));
  TensorView h = t;
  h.on_device = false;
  h.device_ptr = nullptr;
  h.device_bytes = 0;
  h.data = *buf;
  return h;
}

LayerKind KindOf(LayerRoleKind k) {
  switch (k) {
    case LayerRoleKind::kCandidateSource: return LayerKind::kCandidateSource;
    case LayerRoleKind::kCandidateConsumer: return LayerKind::kCandidateConsumer;
    case LayerRoleKind::kBlock: return LayerKind::kBlock;
    default: return LayerKind::kDense;
  }
}

}  // namespace

absl::StatusOr<LayerOutput> Step::RunLayer(const LayerInput& in) {
  const auto t0 = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(CheckLayer(in.layer));
  const Model& m = engine_->model_;
  const int32_t group = m.layer_group[in.layer];
  const GroupSpec& g = m.groups[group];
  const LayerRole role = m.layer_role[in.layer];
  const StepRows& rows = ctx_[group]->rows();
  Backend& b = *engine_->backend_;

  // Validate everything before the first byte is written.
  if (role.kind == LayerRoleKind::kCandidateConsumer && !source_done_[role.set]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "layer: candidate consumer layer ", in.layer, " needs its source layer ",
        m.candidate_sets[role.set].source_layer,
        " to run first in the step; expected the source before its consumers"));
  }
  std::vector<uint8_t> k_converted;  // K of the other FP8 variant, converted
  ASSIGN_OR_RETURN(KInput kin, ValidateK(g, rows.NewEntries(), in.k, &k_converted));
  LayerWork work;
  work.kind = KindOf(role.kind);
  work.k = rows.NewEntries() > 0 ? &kin : nullptr;
  QScratch scratch{std::move(q_values_), std::move(q_scales_), std::move(weights_)};
  // Q that the backend takes from the device as it is stays there; any
  // other device input (FP32/BF16 Q the daemon quantizes, block-layer Q,
  // a mix of host and device tensors) is copied to the host first.
  const bool q_on_device = role.kind != LayerRoleKind::kBlock &&
                           DeviceQReady(g, in.q, in.q_scale, in.weights);
  TensorView q = in.q, q_scale = in.q_scale, weights = in.weights;
  if (!q_on_device) {
    ASSIGN_OR_RETURN(q, HostView(b, "q", in.q, &staged_q_));
    ASSIGN_OR_RETURN(q_scale, HostView(b, "q_scale", in.q_scale, &staged_q_scale_));
    ASSIGN_OR_RETURN(weights, HostView(b, "weights", in.weights, &staged_weights_));
  }
  if (role.kind == LayerRoleKind::kBlock) {
    ASSIGN_OR_RETURN(work.block_q, PrepareBlockQ(g, rows.num_rows, q, q_scale, weights, &block_q_));
    work.block = g.block;
  } else {
    ASSIGN_OR_RETURN(work.q, PrepareQ(g, rows.num_rows, q, q_scale, weights, &scratch));
    work.topk = g.topk;
    if (role.set >= 0) work.candidate = m.candidate_sets[role.set].spec;
  }

  LayerOutput out;
  out.shape = role.kind == LayerRoleKind::kBlock
                  ? std::vector<int64_t>{g.num_heads, rows.num_rows, g.block.topk_blocks}
                  : std::vector<int64_t>{rows.num_rows, g.topk};
  size_t n_out = 1;
  for (int64_t d : out.shape) n_out *= static_cast<size_t>(d);
  // The output: the caller's region when given (device memory: no
  // download), else the caller's bytes (no second copy), else ours.
  const int64_t out_bytes = static_cast<int64_t>(n_out * sizeof(int32_t));
  auto check_out = [&](int64_t got) -> absl::Status {
    if (got == out_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "topk_out.bytes: expected ", out_bytes, " ([", absl::StrJoin(out.shape, ", "),
        "] INT32), got ", got));
  };
  if (in.out_device != nullptr) {
    RETURN_IF_ERROR(check_out(in.out_device_bytes));
    work.out = static_cast<int32_t*>(in.out_device);
    work.out_on_device = true;
  } else if (in.out_host != nullptr) {
    RETURN_IF_ERROR(check_out(in.out_host_bytes));
    // Regions are mapped page-aligned and references 16-byte aligned.
    work.out = reinterpret_cast<int32_t*>(in.out_host);
  } else if (in.out_lease != nullptr &&
             (*in.out_lease = b.host_buffers().Lend(out_bytes))) {
    work.out = reinterpret_cast<int32_t*>(in.out_lease->data());
  } else if (in.out_bytes != nullptr) {
    in.out_bytes->resize(n_out * sizeof(int32_t));
    work.out = reinterpret_cast<int32_t*>(in.out_bytes->data());
  } else {
    out.indices.resize(n_out);
    work.out = out.indices.data();
  }
  out.validate_us = MicrosSince(t0);

  // One backend call: write the new entries, score, select (on the gpu one
  // enqueue and one synchronization). Rollback: the call writes only entries
  // [seq_old_entries, seq_new_entries) of each sequence, i.e. past its
  // committed length, into the tail of its last committed page or into pages
  // taken for this step. If it fails after the write (a device K found
  // non-finite on the device, a kernel error), layer_done_ stays false and
  // no committed length moves, so no reader sees those bytes: the transport
  // aborts the step, Abort frees the step's pages and every sequence keeps
  // its committed entries exactly; a retry of the layer would overwrite the
  // same positions.
  absl::StatusOr<LayerTimings> t =
      b.RunLayer(engine_->pools_[in.layer], ctx_[group].get(), work);
  if (!t.ok()) return engine_->NoteDeviceStatus(t.status());
  out.timings = *t;
  layer_done_[in.layer] = true;
  if (role.kind == LayerRoleKind::kCandidateSource) source_done_[role.set] = true;
  q_values_ = std::move(scratch.values);
  q_scales_ = std::move(scratch.scales);
  weights_ = std::move(scratch.weights);
  return out;
}

absl::StatusOr<std::vector<int64_t>> Step::Commit() {
  if (finished_) return absl::FailedPreconditionError("step: already finished");
  std::vector<int32_t> missing;
  for (size_t l = 0; l < layer_done_.size(); ++l) {
    if (!layer_done_[l]) missing.push_back(static_cast<int32_t>(l));
  }
  if (!missing.empty()) {
    if (missing.size() > 8) missing.resize(8);
    return absl::FailedPreconditionError(absl::StrCat(
        "commit: ", std::count(layer_done_.begin(), layer_done_.end(), false),
        " layers not sent in this step (first: ", absl::StrJoin(missing, ", "),
        "); expected every layer 0..", layer_done_.size() - 1, " before commit"));
  }
  finished_ = true;
  ctx_.clear();
  engine_->FinishStep(this, /*commit=*/true);
  return new_len_;
}

}  // namespace indexer

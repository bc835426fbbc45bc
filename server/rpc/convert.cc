#include "server/rpc/convert.h"

#include "absl/strings/str_cat.h"
#include "kernels/common/status_macros.h"

namespace indexer {

TensorView ViewOf(bool present, const v1::Tensor& t) {
  TensorView v;
  v.present = present;
  v.dtype = static_cast<DType>(t.dtype());
  v.shape.assign(t.shape().begin(), t.shape().end());
  v.data = t.data();
  return v;
}

absl::StatusOr<SeqName> ToSeqName(const std::string& field, const v1::SequenceId& id,
                                  const std::string& ns) {
  switch (id.id_case()) {
    case v1::SequenceId::kNum:
      return SeqName::Numeric(id.num(), ns);
    case v1::SequenceId::kName:
      if (id.name().empty() || id.name().size() > 256) {
        return absl::InvalidArgumentError(absl::StrCat(
            field, ".name: expected 1..256 bytes, got ", id.name().size()));
      }
      return SeqName::Named(id.name(), ns);
    default:
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": expected num or name to be set"));
  }
}

absl::StatusOr<StepSpec> ToStepSpec(const v1::StepHeader& h, const std::string& ns) {
  StepSpec spec;
  spec.request_id = h.request_id();
  for (int i = 0; i < h.sequences_size(); ++i) {
    const v1::StepSequence& s = h.sequences(i);
    ASSIGN_OR_RETURN(SeqName name,
                     ToSeqName(absl::StrCat("header.sequences[", i, "].id"), s.id(), ns));
    spec.seqs.push_back({std::move(name), static_cast<int64_t>(s.q_len()), s.create()});
  }
  return spec;
}

LayerInput ToLayerInput(const v1::LayerRequest& r) {
  LayerInput in;
  in.layer = static_cast<int32_t>(r.layer());
  in.k = ViewOf(r.has_k(), r.k());
  in.k.fp8_codes = static_cast<DType>(r.k_fp8());
  in.q = ViewOf(r.has_q(), r.q());
  in.q_scale = ViewOf(r.has_q_scale(), r.q_scale());
  in.weights = ViewOf(r.has_weights(), r.weights());
  return in;
}

namespace {

absl::StatusOr<PinnedRegion> Resolve(const std::string& field, const v1::TensorRef& ref,
                                     const RegionResolver& regions) {
  if (regions.registry == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(field, ": references need registered regions; none here"));
  }
  ASSIGN_OR_RETURN(PinnedRegion p,
                   regions.registry->Lookup(regions.owner, field,
                                            RegionSpan{ref.region(), ref.offset(), ref.bytes()}));
  if (regions.pins != nullptr) regions.pins->push_back(p);
  return p;
}

}  // namespace

absl::StatusOr<TensorView> ViewOf(const std::string& field, bool present,
                                  const v1::Tensor& t, const RegionResolver& regions) {
  TensorView v = ViewOf(present, t);
  if (!present || !t.has_ref()) return v;
  if (!t.data().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": expected either data or ref, got both (", t.data().size(),
        " inline bytes and a reference to region ", t.ref().region(), ")"));
  }
  ASSIGN_OR_RETURN(PinnedRegion p, Resolve(absl::StrCat(field, ".ref"), t.ref(), regions));
  if (p.on_device) {
    // Device memory: the core checks shape, dtype and byte count and hands
    // the pointer to the backend; nothing reads it on the host.
    v.data = absl::string_view();
    v.on_device = true;
    v.device_ptr = p.data;
    v.device_bytes = static_cast<int64_t>(p.bytes);
  } else {
    v.data = absl::string_view(reinterpret_cast<const char*>(p.data), p.bytes);
  }
  return v;
}

absl::StatusOr<LayerInput> ToLayerInput(const v1::LayerRequest& r,
                                        const RegionResolver& regions) {
  LayerInput in;
  in.layer = static_cast<int32_t>(r.layer());
  ASSIGN_OR_RETURN(in.k, ViewOf("k", r.has_k(), r.k(), regions));
  in.k.fp8_codes = static_cast<DType>(r.k_fp8());
  ASSIGN_OR_RETURN(in.q, ViewOf("q", r.has_q(), r.q(), regions));
  ASSIGN_OR_RETURN(in.q_scale, ViewOf("q_scale", r.has_q_scale(), r.q_scale(), regions));
  ASSIGN_OR_RETURN(in.weights, ViewOf("weights", r.has_weights(), r.weights(), regions));
  if (r.has_topk_out()) {
    ASSIGN_OR_RETURN(PinnedRegion p, Resolve("topk_out", r.topk_out(), regions));
    if (p.on_device) {
      in.out_device = p.data;
      in.out_device_bytes = static_cast<int64_t>(p.bytes);
    } else {
      in.out_host = p.data;
      in.out_host_bytes = static_cast<int64_t>(p.bytes);
    }
  }
  return in;
}

absl::StatusOr<std::vector<SeqName>> ToReleaseNames(const v1::ReleaseRequest& req,
                                                    const std::string& ns) {
  std::vector<SeqName> names;
  for (int i = 0; i < req.ids_size(); ++i) {
    ASSIGN_OR_RETURN(SeqName name, ToSeqName(absl::StrCat("ids[", i, "]"), req.ids(i), ns));
    names.push_back(std::move(name));
  }
  return names;
}

absl::StatusOr<ImportArgs> ToImport(const v1::WriteEntriesRequest& req, int64_t max_q_len,
                                    const std::string& ns) {
  ImportArgs a;
  ASSIGN_OR_RETURN(a.name, ToSeqName("id", req.id(), ns));
  if (req.num_tokens() < 1 || req.num_tokens() > static_cast<uint64_t>(max_q_len)) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens: expected 1..", max_q_len,
                                                   ", got ", req.num_tokens()));
  }
  a.create = req.create();
  a.num_tokens = static_cast<int64_t>(req.num_tokens());
  for (const v1::LayerEntries& le : req.layers()) {
    a.layers.emplace_back(static_cast<int32_t>(le.layer()), ViewOf(le.has_k(), le.k()));
    a.layers.back().second.fp8_codes = static_cast<DType>(le.k_fp8());
  }
  return a;
}

absl::StatusOr<ExportArgs> ToExport(const v1::ExportEntriesRequest& req,
                                    int64_t daemon_max_message_bytes, int64_t max_q_len,
                                    const std::string& ns) {
  ExportArgs args;
  ASSIGN_OR_RETURN(args.name, ToSeqName("id", req.id(), ns));
  if (req.max_message_bytes() > static_cast<uint64_t>(daemon_max_message_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_message_bytes: expected 0..", daemon_max_message_bytes,
        " (the daemon's max_message_bytes; 0 = that), got ", req.max_message_bytes()));
  }
  if (req.max_tokens() > static_cast<uint64_t>(max_q_len)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_tokens: expected 0..", max_q_len, " (max_q_len; 0 = that), got ", req.max_tokens()));
  }
  args.max_message_bytes = req.max_message_bytes() == 0
                               ? daemon_max_message_bytes
                               : static_cast<int64_t>(req.max_message_bytes());
  args.max_tokens = req.max_tokens() == 0 ? max_q_len : static_cast<int64_t>(req.max_tokens());
  return args;
}

int64_t ExportFramingBytes(int32_t num_layers) {
  // Top level: id (tag, length, oneof tag, length, 256 bytes), create,
  // num_tokens, the layers' tags and lengths; per layer: the layer id, the
  // tensor's tag and length, dtype, a packed shape of two int64, the data's
  // tag and length. Rounded up generously: a message must never exceed the
  // limit the caller asked for.
  return 512 + 64 * static_cast<int64_t>(num_layers);
}

v1::WriteEntriesRequest ExportMessage(const Model& model, const v1::SequenceId& id,
                                      SequenceExport::Chunk& chunk) {
  v1::WriteEntriesRequest msg;
  *msg.mutable_id() = id;
  msg.set_create(chunk.first_token == 0);
  msg.set_num_tokens(static_cast<uint64_t>(chunk.num_tokens));
  for (int32_t l = 0; l < model.num_layers(); ++l) {
    const int64_t eb = model.groups[model.layer_group[l]].layout.entry_bytes();
    v1::LayerEntries* le = msg.add_layers();
    le->set_layer(static_cast<uint32_t>(l));
    v1::Tensor* k = le->mutable_k();
    k->set_dtype(v1::UINT8);
    k->add_shape(static_cast<int64_t>(chunk.layers[l].size()) / eb);
    k->add_shape(eb);
    k->set_data(std::move(chunk.layers[l]));
  }
  return msg;
}

}  // namespace indexer
